"""The `slogate` command line (entry point tooling.cli.main:main).

What lives here: main.py (collects the subcommands, in `slogate --help`'s order), common.py
(what several share), and one module per subcommand that registers its own parser and
handler: envoy_config, up, engine, k8s, admin (status / keys / reload / drill / drain), keys
(keys add / revoke / rotate / list), tenants, policy (+ policy_traffic: `policy diff
--traffic`), simulate, replay, workload, loadtest, preflight, calibrate, bench. `serve` is the
product's: extproc.runtime.serve_command. A handler imports its heavy dependencies (the
simulator, the stack, the benchmarks) when it runs.
"""
