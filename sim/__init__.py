"""The simulator: a stand-in for vLLM engines, an offline fleet on a virtual clock, and the
studies built on it. Nothing here is imported by the running sidecar.

Three subpackages, one import direction (import-linter checks it): `sim.studies` uses
`sim.fleet`, which uses `sim.server`; never the other way.

- `sim.server`   the simulated engine server: a vLLM-compatible HTTP pool (`python -m
                 sim.server.pool`), its latency / KV-cache / prefix-cache model, faults,
                 vLLM's metric names, the latency fit from measurements (`slogate calibrate`).
- `sim.fleet`    the offline fleet that runs the sidecar's own code (admission chain,
                 breaker, controller, engine picking) on a virtual clock: arrivals, prompts,
                 conversations, workload files and their fit to recorded traffic, the
                 fleet's engines, one run and its summary, replaying recorded traffic.
- `sim.studies`  comparisons and reports on the fleet: static against dynamic quotas
                 (`slogate simulate`), engine picking, the waiting room and the replicas, a
                 policy change on recorded traffic, and the plots.
- `sim/workloads/*.yaml` the workload files (package data; sim.fleet.workload_files reads
                 them).
"""
