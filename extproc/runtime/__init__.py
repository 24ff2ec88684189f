"""The sidecar process. `slogate serve` (serve_command: its arguments and handler; serve: one
process until a signal) and `--workers N` (supervisor, workers; the one process wrapper,
processes). The composition root (sidecar) and its parts (parts: signals, observers, the
request path, control; stores: budgets and the KV ledger; grpc_servers: the listeners),
started and stopped by one exit stack. Beside the request path: the policy holder and
reloads (policy_holder, candidate_holder), the periodic work (periodic, loops), engines found,
probed and scraped (engine_watch, engines), GPU memory (gpu), the key store (key_store,
key_redis), the spend metrics (spend_metrics), what the steps report (events), the event
loop's lag (loop_lag), large builds beside the loop (heap) and the warm-up (warm_up).
"""
