"""The offline fleet: the sidecar's own code on a virtual clock, with simulated engines.

What lives here:
- `clock` (the virtual clock), `arrivals` (Poisson and shaped arrivals, P99), `prompts` and
  `conversations` (prompt texts counted with the sidecar's counter; chats and RAG with
  shared prefixes), `workload_files` (sim/workloads/*.yaml -> a policy and arrivals),
  `workload_fit` (a workload fitted to a traffic record), `synthetic_weeks` (a seeded
  traffic record of weeks of daily traffic with a weekly shape, for the forecasts);
- `sidecar` (a simulated sidecar: the admission chain, breaker board and engine picking the
  real one runs), `engine_pool` (the fleet's engines and how Envoy reaches one),
  `fleet_requests` (a request's life in the fleet), `fleet_types` (what a run returns),
  `offline` (`OfflineFleet`: the event loop);
- `fleet_runs` (one run, or many side by side), `run_summary` (what a run came to),
  `replay` (recorded traffic through the fleet, `slogate replay`).

It uses sim.server's model of an engine (latency, KV cache, prefix cache); nothing of
sim.studies.
"""
