"""`slogate preflight`: the field's checklists against a running deployment.

What lives here: run (runs the checks, one line per check, exit 1 on a failure), checks (each
check's verdict from values already measured; no I/O), probes (the measurements: Prometheus,
the breaker's history, the engines), drills (a breaker drill to L3 and back, and each
degradation preset, on a live pool). The command line is tooling.cli.preflight.
"""
