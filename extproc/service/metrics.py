"""Prometheus metrics of one sidecar, in a registry of its own.

Labels are bounded: pool, bucket, tier, tenant-free request labels, reason, phase, status,
and tenant, capped at the policy's `telemetry.tenant_series_max` tenants with the rest in
`tenant="other"` (extproc.service.tenant_series). Never an API key, a request id or prompt
text. The metrics catalogue (docs/sre/metrics.md) lists these.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.service.loop_metrics import Family, LoopCounter, LoopHistogram
from extproc.service.quota_metrics import QuotaMetrics
from extproc.service.tenant_family import TenantFamily
from extproc.service.tenant_series import TenantSeries, declared_tenants
from policy.schema import Policy

# fmt: off
_LATENCY_BUCKETS_S = (
    0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0,
    34.0, 60.0, 120.0, 300.0,
)
_DECISION_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)
_WAIT_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0,
)
# fmt: on
_CONTEXT_BUCKETS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


class AdmissionCollector(Collector):
    """What admission holds per pool, computed at scrape time from `source` (the ledger's
    tokens and requests by pool): two dict reads per scrape instead of two gauge updates
    per request."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]] | None = None
        # (pool, tier) -> requests waiting in the waiting room
        self.waiting: Callable[[], Mapping[tuple[str, str], int]] | None = None

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "slogate_kv_in_flight_tokens",
                "KV-cache footprint (context x bucket KV weight) of the requests this sidecar "
                "admitted and has not seen end, by pool (pools with kv_capacity_tokens or "
                "max_num_seqs).",
                labels=["pool"],
            ),
            GaugeMetricFamily(
                "slogate_sequences_in_flight",
                "Requests this sidecar admitted and has not seen end, by pool (pools with "
                "kv_capacity_tokens or max_num_seqs).",
                labels=["pool"],
            ),
            GaugeMetricFamily(
                "slogate_waiting_requests",
                "Requests waiting in the waiting room for room in their pool, by pool and tier.",
                labels=["pool", "tier"],
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        tokens, requests, waiting = self._families()
        if self.source is not None:
            held_tokens, held_requests = self.source()
            for pool, value in sorted(held_tokens.items()):
                tokens.add_metric([pool], value)
            for pool, value in sorted(held_requests.items()):
                requests.add_metric([pool], value)
        if self.waiting is not None:
            for (pool, tier), value in sorted(self.waiting().items()):
                waiting.add_metric([pool, tier], value)
        return (tokens, requests, waiting)


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()

        def counter(name: str, doc: str, labels: list[str]) -> Family[Counter]:
            return Family(LoopCounter(name, doc, labels, registry=r))

        def histogram(
            name: str, doc: str, labels: list[str], buckets: tuple[float, ...]
        ) -> Family[Histogram]:
            return Family(LoopHistogram(name, doc, labels, buckets=buckets, registry=r))

        def gauge(name: str, doc: str, labels: list[str]) -> Family[Gauge]:
            return Family(Gauge(name, doc, labels, registry=r))

        # The process, for growth over days and reloads: resident memory, CPU, open files
        # (process_*), and what the collector never walks (extproc.runtime.heap freezes
        # what outlives a reload): a slope in either is a leak.
        ProcessCollector(registry=r)
        frozen = Gauge(
            "slogate_gc_frozen_objects",
            "Objects in the garbage collector's permanent generation (gc.freeze): left out "
            "of every collection, freed only by reference counting.",
            registry=r,
        )
        frozen.set_function(gc.get_freeze_count)

        # Who keeps a tenant label of their own (rerank_tenants applies the policy's cap).
        self.tenants = tenants = TenantSeries()

        def tenant_counter(name: str, doc: str, labels: list[str]) -> TenantFamily[Counter]:
            return TenantFamily(LoopCounter(name, doc, labels, registry=r), tenants)

        self.decisions = counter(
            "slogate_decisions_total",
            "Requests admitted and routed, by pool, context bucket, tier and API.",
            ["pool", "bucket", "tier", "api"],
        )
        self.rejections = counter(
            "slogate_rejections_total",
            "Requests answered with an error by the sidecar, by reason and HTTP status.",
            ["reason", "status"],
        )
        self.decision_seconds = histogram(
            "slogate_decision_seconds",
            "Sidecar time spent per ext_proc message (headers, body), from receipt to reply.",
            ["phase"],
            _DECISION_BUCKETS_S,
        )
        self.prompt_counts = counter(
            "slogate_prompt_counts_total",
            "How routed prompts were counted: exact (DeepSeek's vocabulary), cached (every "
            "message counted before), bound (too large to count: one token per byte), busy "
            "(the counter was busy: one token per byte).",
            ["kind"],
        )
        self.prompt_undercounts = tenant_counter(
            "slogate_prompt_undercounts_total",
            "Settled requests whose engine-reported prompt exceeded slogate's count by more "
            "than 10%, by tenant.",
            ["tenant"],
        )
        self.prompt_correction = TenantFamily(
            Gauge(
                "slogate_prompt_correction",
                "Factor on the prompt counts of a key whose settled prompts keep exceeding "
                "them (1.0: none), the latest one set for a key of this tenant.",
                ["tenant"],
                registry=r,
            ),
            tenants,
        )
        self.context_tokens = histogram(
            "slogate_request_context_tokens",
            "Context length (prompt estimate + max_tokens) of admitted requests, by pool.",
            ["pool"],
            _CONTEXT_BUCKETS,
        )
        self.ttft_seconds = histogram(
            "slogate_upstream_ttft_seconds",
            "Time to the first token: a stream's first output event, a JSON answer's first byte.",
            ["pool", "bucket", "tier"],
            _LATENCY_BUCKETS_S,
        )
        self.tenant_ttft_seconds = TenantFamily(
            LoopHistogram(
                "slogate_tenant_ttft_seconds",
                'TTFT per tenant (the busiest tenant_series_max tenants; the rest tenant="other").',
                ["tenant"],
                buckets=_LATENCY_BUCKETS_S,
                registry=r,
            ),
            tenants,
        )
        self.duration_seconds = histogram(
            "slogate_upstream_duration_seconds",
            "Total request duration as Envoy saw it, for requests the sidecar routed.",
            ["pool", "bucket", "tier"],
            _LATENCY_BUCKETS_S,
        )
        self.tpot_seconds = histogram(
            "slogate_upstream_time_per_output_token_seconds",
            "(duration - TTFT) / (completion tokens - 1), for responses with 2+ tokens.",
            ["pool", "bucket"],
            (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0),
        )
        self.tokens = counter(
            "slogate_tokens_total",
            "Tokens reported by upstream usage, by pool, bucket and kind (prompt, completion).",
            ["pool", "bucket", "kind"],
        )
        self.responses = counter(
            "slogate_responses_total",
            "Finished routed requests by pool and status class (2xx, 4xx, 5xx, other).",
            ["pool", "code_class"],
        )
        self.usage_missing = counter(
            "slogate_usage_missing_total",
            "Successful routed responses that reported no usage (settled on the estimate).",
            ["pool"],
        )
        self.estimate_ratio = LoopHistogram(
            "slogate_prompt_estimate_ratio",
            "Counted / engine-reported prompt tokens of finished requests (1.0: the same; the "
            "engine's chat template makes it a little different).",
            buckets=(0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0),
            registry=r,
        )
        self.access_log_entries = counter(
            "slogate_access_log_entries_total",
            "Access-log entries received from Envoy, by kind (routed, unmatched, other), "
            "requests whose end their ext_proc stream saw (stream_end: streaming mode), and "
            "requests whose reply Envoy never took (undelivered: ended with nothing used).",
            ["kind"],
        )
        self.access_log_unproven = Counter(
            "slogate_access_log_unproven_total",
            "Access-log entries naming a request in flight without its proof (not from this "
            "sidecar's Envoy: forged, or a stale configuration); nothing was settled.",
            registry=r,
        )
        self.inflight = Gauge(
            "slogate_inflight_requests",
            "Routed requests whose access-log entry has not arrived yet.",
            registry=r,
        )
        self.inflight_expired = Counter(
            "slogate_inflight_expired_total",
            "Routed requests whose access-log entry never came; settled by expiry.",
            registry=r,
        )
        self.envoy_local_replies = counter(
            "slogate_envoy_local_replies_total",
            "Errors Envoy answered itself (e.g. body over the buffer limit, sidecar down).",
            ["status"],
        )
        # The one tenant family touched once per request: its calls are the traffic that
        # decides which tenants keep their own series.
        self.budget_decisions = TenantFamily(
            LoopCounter(  # the budget step's, on the loop: no lock per request
                "slogate_budget_decisions_total",
                "Budget reservations by tenant and result (ok, or the limit that refused: "
                "requests, tokens, hour, concurrency).",
                ["tenant", "result"],
                registry=r,
            ),
            tenants,
            counts=True,
        )
        self.tenant_tokens = tenant_counter(
            "slogate_tenant_tokens_total",
            "Raw tokens (prompt + completion) settled per tenant; rate() gives the "
            "sliding-window usage.",
            ["tenant"],
        )
        self.budget_store_decisions = counter(
            "slogate_budget_store_decisions_total",
            "Budget decisions by where they were made: shared (Redis) or local (degraded).",
            ["store"],
        )
        self.redis_up = Gauge(
            "slogate_redis_up",
            "1 while the shared budget store answers, 0 while deciding on local shares.",
            registry=r,
        )
        self.kv_ledger_decisions = counter(
            "slogate_kv_ledger_decisions_total",
            "KV admission decisions by where they were made: shared (the fleet's ledger in "
            "Redis) or local (this replica's share of each pool, while Redis is away).",
            ["store"],
        )
        self.kv_ledger_shared = Gauge(
            "slogate_kv_ledger_shared",
            "1 while KV admission decides on the fleet's shared ledger, 0 on local shares.",
            registry=r,
        )
        self.fleet_replicas = Gauge(
            "slogate_fleet_replicas",
            "Sidecar replicas alive by their heartbeats in the shared store (what a pool is "
            "divided by while the shared ledger is away).",
            registry=r,
        )
        self.shed = counter(
            "slogate_shed_total",
            "Requests the breaker refused or sent to the fallback pool, by tier and reason.",
            ["tier", "reason"],
        )
        self.breaker_probes = counter(
            "slogate_breaker_probes_total",
            "Requests let through as half-open probes, by pool.",
            ["pool"],
        )
        self.breaker_transitions = counter(
            "slogate_breaker_transitions_total",
            "Breaker level changes (and failed probes, from == to) by pool, from, to, reason.",
            ["pool", "from_level", "to_level", "reason"],
        )
        self.breaker_level = gauge(
            "slogate_breaker_level",
            "Breaker level in force per pool (0-3, drills included); pool=global too.",
            ["pool"],
        )
        self.breaker_drill = gauge(
            "slogate_breaker_drill_level",
            "Level forced by a running drill per pool (0: no drill).",
            ["pool"],
        )
        self.breaker_signal = gauge(
            "slogate_breaker_signal",
            "Signal values the breaker last used (NaN: no data), by pool and signal.",
            ["pool", "signal"],
        )
        self.tenant_demand = TenantFamily(
            Gauge(
                "slogate_tenant_demand_tokens_per_minute",
                "Weighted tokens per minute a tenant's keys settled in the last controller "
                "interval (actual) and the Holt-Winters forecast 3 intervals ahead (forecast); "
                "keys with a tokens-per-minute limit. With `forecast.enabled`, the seasonal "
                "forecast from the traffic record now (seasonal) and its highest bin in the "
                "next hour (seasonal_next_hour).",
                ["tenant", "kind"],
                registry=r,
            ),
            tenants,
        )
        self.kv_footprint_ratio = gauge(
            "slogate_kv_footprint_ratio",
            "KV the engines report holding per token admission counted (prompt + "
            "max_tokens), learned per pool; 1.0: the upper bound.",
            ["pool"],
        )
        # Read from the admission ledger when Prometheus scrapes, not set per request.
        self.admission = AdmissionCollector()
        r.register(self.admission)
        self.wait_seconds = histogram(
            "slogate_wait_seconds",
            "Time requests spent in the waiting room before they left it (dispatched, timed "
            "out or cancelled), by tier.",
            ["tier"],
            _WAIT_BUCKETS_S,
        )
        self.wait_outcomes = counter(
            "slogate_wait_outcomes_total",
            "Requests that met the waiting room, by tier and outcome (dispatched, timed_out, "
            "full, cancelled).",
            ["tier", "outcome"],
        )
        self.wait_alert_bound = gauge(
            "slogate_wait_alert_seconds",
            "The policy's bound on the P99 wait per tier (waiting_room."
            "alert_critical_p99_wait_s): the wait alert compares slogate_wait_seconds to it.",
            ["tier"],
        )
        # The quota controller's: tier multipliers, the planner ahead of ramps, KV lending.
        self.quotas = QuotaMetrics(r)
        self.gpu_available = Gauge(
            "slogate_gpu_available",
            "1 when NVML reports a GPU on this node; 0: GPU memory signal unavailable.",
            registry=r,
        )
        self.policy_reloads = counter(
            "slogate_policy_reloads_total",
            "Policy reload attempts by result (ok, rejected).",
            ["result"],
        )
        self.policy_keys = Gauge(
            "slogate_policy_keys", "API keys in the active policy.", registry=r
        )

    def rerank_tenants(self, policy: Policy) -> list[str]:
        """Re-rank who keeps a tenant label under the policy's cap (every RERANK_INTERVAL_S,
        and once at start so the cap holds from the first request); the evicted tenants'
        series are removed. Returns those tenants."""
        return self.tenants.rerank(policy.telemetry.tenant_series_max, declared_tenants(policy))
