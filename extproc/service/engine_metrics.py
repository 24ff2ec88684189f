"""The engines of every pool in Prometheus, read from the fleet when Prometheus scrapes.

What lives here: `EngineCollector`: per engine (labels pool, engine = `ip:port`: bounded
by the fleet's size) its state, KV capacity, what this sidecar holds on it, the requests
it was sent and the answers it gave, and its scraped KV usage, queue and prefix-cache hit
rate; per pool, the prefix index's size. Nothing is set per request: the collector reads
the fleet (engines.state) and the picker's indexes at scrape time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engines.engine import EngineState
from engines.picker import EnginePicker
from policy.schema import Policy


class EngineCollector(Collector):
    def __init__(self, picker: EnginePicker, policy: Callable[[], Policy]) -> None:
        self._picker = picker
        self._policy = policy

    def describe(self) -> Iterable[Metric]:
        return ()  # collected on demand; the names are in collect()

    def collect(self) -> Iterable[Metric]:
        fleet = self._picker.fleet
        policy = self._policy()
        labels = ["pool", "engine"]
        state = GaugeMetricFamily(
            "slogate_engine_state",
            "1 for the state each engine is in (serving, draining, dead), by pool and engine.",
            labels=[*labels, "state"],
        )
        capacity = GaugeMetricFamily(
            "slogate_engine_kv_capacity_tokens",
            "An engine's KV cache in tokens: what it reports, else the pool's even share.",
            labels=labels,
        )
        held_tokens = GaugeMetricFamily(
            "slogate_engine_held_tokens",
            "KV footprint of the requests this sidecar sent the engine that still run.",
            labels=labels,
        )
        held_requests = GaugeMetricFamily(
            "slogate_engine_held_requests",
            "Requests this sidecar sent the engine that still run.",
            labels=labels,
        )
        picked = CounterMetricFamily(
            "slogate_engine_picked",
            "Requests this sidecar sent the engine (picked it first).",
            labels=labels,
        )
        answers = CounterMetricFamily(
            "slogate_engine_answers",
            "Answers from the engine in the access log, by outcome (ok; failed: 5xx, refused, "
            "reset or timed out).",
            labels=[*labels, "outcome"],
        )
        scraped = GaugeMetricFamily(
            "slogate_engine_scraped",
            "The engine's latest scraped signals: kv_cache_usage, running, waiting, "
            "prefix_cache_hit_rate (NaN: not reported or stale).",
            labels=[*labels, "signal"],
        )
        prefix_hits = CounterMetricFamily(
            "slogate_engine_prefix_cache_hits",
            "The engine's prefix-cache hits in tokens since it started, as scraped (vLLM).",
            labels=labels,
        )
        prefix_queries = CounterMetricFamily(
            "slogate_engine_prefix_cache_queries",
            "The engine's prefix-cache queries in tokens since it started, as scraped (vLLM).",
            labels=labels,
        )
        index = GaugeMetricFamily(
            "slogate_prefix_index_entries",
            "Prefix hashes the engine picker remembers for the pool (bounded by "
            "engines.picking.index_entries).",
            labels=["pool"],
        )
        stale_s = policy.breaker.stale_after_s
        for pool, engines in fleet.table().items():
            spec = policy.pools.get(pool)
            for engine in engines:
                names = [pool, engine.address]
                current = fleet.state(engine)
                for each in EngineState:
                    state.add_metric([*names, each.value], 1.0 if each is current else 0.0)
                size = fleet.kv_tokens(engine, spec) if spec is not None else None
                if size is not None:
                    capacity.add_metric(names, size)
                held_tokens.add_metric(names, engine.held_tokens)
                held_requests.add_metric(names, engine.held_sequences)
                picked.add_metric(names, engine.picked)
                answers.add_metric([*names, "ok"], engine.answered - engine.failed)
                answers.add_metric([*names, "failed"], engine.failed)
                fresh = engine.fresh(fleet.now(), stale_s)
                for signal in ("kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate"):
                    value = None if fresh is None else getattr(fresh, signal)
                    scraped.add_metric([*names, signal], math.nan if value is None else value)
                if fresh is not None and fresh.prefix_cache_queries is not None:
                    prefix_queries.add_metric(names, fresh.prefix_cache_queries)
                    prefix_hits.add_metric(names, fresh.prefix_cache_hits or 0.0)
        for pool, prefix_index in self._picker.indexes.items():
            index.add_metric([pool], len(prefix_index))
        return (
            state,
            capacity,
            held_tokens,
            held_requests,
            picked,
            answers,
            scraped,
            prefix_hits,
            prefix_queries,
            index,
        )
