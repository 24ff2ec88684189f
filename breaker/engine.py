"""Upstream engine signals: what vLLM's metrics say about each pool. Pure.

What lives here: `parse_vllm_metrics` (exposition text -> `EngineSnapshot`) and
`EngineReadings`, which keeps each endpoint's latest snapshot with the time it was read and
answers the breaker's questions per pool. Fetching the metrics (HTTP) and reading GPU memory
(NVML) is I/O and lives with the sidecar's runtime (extproc.runtime.engines, .gpu): this
package holds no I/O.

"No data" is decided here: an endpoint that has not answered within `stale_after_s`
reports KV-cache usage 1.0, i.e. saturated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    kv_cache_usage: float | None  # 0..1
    running: float | None
    waiting: float | None
    prefix_cache_hit_rate: float | None  # hits / queries since the engine started


def parse_vllm_metrics(text: str) -> EngineSnapshot:
    """Read the vLLM names; samples of several models or engines are summed (max for KV)."""
    kv: float | None = None
    running = waiting = hits = queries = None

    def add(current: float | None, value: float) -> float:
        return value if current is None else current + value

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                kv = value if kv is None else max(kv, value)
            elif name == "vllm:num_requests_running":
                running = add(running, value)
            elif name == "vllm:num_requests_waiting":
                waiting = add(waiting, value)
            elif name == "vllm:prefix_cache_hits_total":
                hits = add(hits, value)
            elif name == "vllm:prefix_cache_queries_total":
                queries = add(queries, value)
    hit_rate = hits / queries if hits is not None and queries else None
    return EngineSnapshot(kv, running, waiting, hit_rate)


class EngineReadings:
    """The latest snapshot of every pool endpoint, and what it means for each pool."""

    def __init__(
        self,
        endpoints: Callable[[], Mapping[str, Iterable[tuple[str, int]]]],
        interval_s: float = 5.0,
        stale_after_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoints = endpoints
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._latest: dict[tuple[str, str, int], tuple[float, EngineSnapshot]] = {}
        self._started_s = clock()

    def record(self, pool: str, host: str, port: int, snapshot: EngineSnapshot) -> None:
        self._latest[(pool, host, port)] = (self._clock(), snapshot)

    def kv_cache_usage(self, pool: str) -> float | None:
        """Worst endpoint of the pool; 1.0 when any endpoint's metrics are stale."""
        now_s = self._clock()
        worst: float | None = None
        for host, port in self.endpoints().get(pool, ()):
            seen = self._latest.get((pool, host, port))
            if seen is None:
                if now_s - self._started_s < self.stale_after_s:
                    continue  # just started: not stale yet
                return 1.0
            at_s, snapshot = seen
            if now_s - at_s > self.stale_after_s:
                return 1.0
            if snapshot.kv_cache_usage is not None:
                worst = (
                    snapshot.kv_cache_usage
                    if worst is None
                    else max(worst, snapshot.kv_cache_usage)
                )
        return worst

    def queue_ratio(self, pool: str) -> float | None:
        """Waiting / running requests over the pool's fresh endpoints; None without data
        (stale endpoints already read as a full KV cache)."""
        now_s = self._clock()
        waiting = running = 0.0
        seen = False
        for host, port in self.endpoints().get(pool, ()):
            latest = self._latest.get((pool, host, port))
            if latest is None or now_s - latest[0] > self.stale_after_s:
                continue
            snapshot = latest[1]
            if snapshot.waiting is None:
                continue
            seen = True
            waiting += snapshot.waiting
            running += snapshot.running or 0.0
        return waiting / max(1.0, running) if seen else None

    def snapshot(self, pool: str, host: str, port: int) -> EngineSnapshot | None:
        seen = self._latest.get((pool, host, port))
        return None if seen is None else seen[1]
