"""The local stack: what `slogate up`, the benchmarks and the tests start on loopback.

What lives here: local (LocalStack: pools, sidecars, Envoys, Redis, replicas), pool_engines
(a pool's simulated or real engines, the runtime policy), vllm_engine and tiny_model (a real
vLLM on a model made here), redis (Redis servers and clusters), prometheus_server and
prometheus_api (a Prometheus and its HTTP API), otlp_receiver (spans received in tests),
processes (free ports, process usage, Envoy's binary, `slogate serve` as a child). Starting
and stopping one process is extproc.runtime.processes' ManagedProcess.
"""
