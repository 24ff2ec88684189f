"""vLLM-named Prometheus metrics of one simulated pool, in its own CollectorRegistry.

A private registry (never the global one) lets several pools live in one test process. Latency
histograms record REAL elapsed seconds, i.e. what a client or Envoy measured, time scaling and
fault latency included. `request_time_per_output_token_seconds` is observed once per request
(its mean inter-token time), as vLLM does. Names, types and labels (`engine`, `model_name`)
are vLLM 0.32's, held to a real vLLM by tests/e2e/test_sim_matches_vllm.py; the simulator
exports a subset. `num_preemptions_total` stays 0: the simulated engine reserves a
request's whole footprint when it starts it, so it never has to preempt one (vLLM grows
each request block by block and preempts when the cache runs out).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sim.server.model import KvCache

# Bucket bounds as vLLM declares them, so dashboards and recording rules line up.
_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_LABELS = ("engine", "model_name")
_ENGINE = "0"  # vLLM labels each engine core; one per simulated pool


class PoolMetrics:
    def __init__(self, model_name: str, kv_capacity_tokens: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        m = model_name

        def engine_gauge(name: str, text: str) -> Gauge:
            """A gauge of this engine core and model (vLLM's labels)."""
            return Gauge(name, text, _LABELS, registry=reg).labels(_ENGINE, m)

        def engine_counter(name: str, text: str) -> Counter:
            return Counter(name, text, _LABELS, registry=reg).labels(_ENGINE, m)

        def engine_histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, text, _LABELS, buckets=buckets, registry=reg).labels(_ENGINE, m)

        self._kv_usage = engine_gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.")
        self._running = engine_gauge("vllm:num_requests_running", "Requests in the running batch.")
        self._waiting = engine_gauge("vllm:num_requests_waiting", "Requests waiting for KV cache.")
        self.prefix_queries = engine_counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up."
        )
        self.prefix_hits = engine_counter("vllm:prefix_cache_hits", "Prompt tokens found cached.")
        self.prompt_tokens = engine_counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = engine_counter(
            "vllm:generation_tokens", "Generation tokens produced."
        )
        self._request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            (*_LABELS, "finished_reason"),
            registry=reg,
        )
        self._model_name = m
        self.preemptions = engine_counter("vllm:num_preemptions", "Preemptions (never, here).")
        # What `slogate up` and tooling.stack.vllm_engine read a pool's KV size from.
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("engine", "block_size", "num_gpu_blocks", "kv_cache_size_tokens"),
            registry=reg,
        ).labels(_ENGINE, "1", str(kv_capacity_tokens), str(kv_capacity_tokens)).set(1)
        self.ttft_s = engine_histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, queueing included.",
            _TTFT_BUCKETS_S,
        )
        self.e2e_s = engine_histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token.", _E2E_BUCKETS_S
        )
        self.tpot_s = engine_histogram(
            "vllm:request_time_per_output_token_seconds",
            "Mean inter-token time of a request.",
            _TPOT_BUCKETS_S,
        )

    def request_finished(self, finished_reason: str) -> None:
        self._request_success.labels(_ENGINE, self._model_name, finished_reason).inc()

    def render(self, kv: KvCache) -> bytes:
        """Exposition text; gauges are read from the KV cache at scrape time, never stale."""
        self._kv_usage.set(kv.usage_perc)
        self._running.set(kv.num_running)
        self._waiting.set(kv.num_waiting)
        return generate_latest(self.registry)
