"""Upstream engine signals: what vLLM's metrics say about each pool. Pure.

What lives here: `parse_engine_metrics` (exposition text -> `EngineSnapshot`, with vLLM's
or SGLang's names: `ENGINE_METRICS`, chosen per pool by the policy's `engine`) and
`EngineReadings`, which keeps each endpoint's latest snapshot with the time it was read and
answers the breaker's questions per pool. Fetching the metrics (HTTP) and reading GPU memory
(NVML) is I/O and lives with the sidecar's runtime (extproc.runtime.engines, .gpu): this
package holds no I/O.

"No data" is decided here: an endpoint that has not answered within `stale_after_s`
reports KV-cache usage 1.0, i.e. saturated.

The engines' TTFT histogram (`vllm:time_to_first_token_seconds`) is the breaker's fast,
fleet-wide latency signal: every replica scrapes every endpoint, so each sees the whole
pool's first tokens, counted when the first token is out — not when the request ends, as
the access log's samples are (a 2k-token stream reports its TTFT tens of seconds late).
`ttft_quantile_s` reads it over a window from the difference of two scrapes per endpoint.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from policy.domain import EngineKind


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    kv_cache_usage: float | None  # 0..1
    running: float | None
    waiting: float | None
    prefix_cache_hit_rate: float | None  # hits / queries since the engine started
    # The TTFT histogram since the engine started: (upper bound s, cumulative count), +Inf
    # last; summed over the engine's label sets. Empty: not exported.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    # The engine's KV cache in tokens, as it reports it; None: not reported.
    kv_capacity_tokens: float | None = None
    # The prefix-cache counters behind the ratio (vLLM), exported as they are: only their
    # rates over a window give a hit rate that moves with the cache (the dashboard's).
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None


@dataclass(frozen=True, slots=True)
class MetricNames:
    """One engine's names for the signals slogate reads."""

    kv_usage: tuple[str, ...]  # 0..1 gauges; the worst one counts
    running: str
    waiting: str
    ttft_bucket: str
    prefix_hits: str | None = None  # counters, hits / queries since start
    prefix_queries: str | None = None
    prefix_hit_rate: str | None = None  # or the engine's own ratio gauge
    # Where the engine reports its KV cache size: an info metric whose labels carry
    # `num_gpu_blocks` x `block_size` (vLLM), or a gauge of tokens (SGLang).
    cache_info: str | None = None
    cache_tokens: str | None = None

    @property
    def sample_names(self) -> frozenset[str]:
        """Every sample name read: the lines worth parsing."""
        named = (
            self.running,
            self.waiting,
            self.ttft_bucket,
            self.prefix_hits,
            self.prefix_queries,
            self.prefix_hit_rate,
            self.cache_info,
            self.cache_tokens,
        )
        return frozenset([*self.kv_usage, *(n for n in named if n is not None)])


ENGINE_METRICS: Mapping[EngineKind, MetricNames] = {
    EngineKind.VLLM: MetricNames(
        # gpu_cache_usage_perc: vLLM's name for it before the V1 engine.
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        ttft_bucket="vllm:time_to_first_token_seconds_bucket",
        prefix_hits="vllm:prefix_cache_hits_total",
        prefix_queries="vllm:prefix_cache_queries_total",
        cache_info="vllm:cache_config_info",
    ),
    # SGLang (with --enable-metrics), from its production-metrics documentation.
    EngineKind.SGLANG: MetricNames(
        kv_usage=("sglang:token_usage",),
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        ttft_bucket="sglang:time_to_first_token_seconds_bucket",
        prefix_hit_rate="sglang:cache_hit_rate",
        cache_tokens="sglang:max_total_num_tokens",
    ),
}


def parse_engine_metrics(text: str, kind: EngineKind = EngineKind.VLLM) -> EngineSnapshot:
    """Read one engine's names; samples of several models, engines or ranks are summed (the
    worst for KV usage and the prefix-cache ratio gauge)."""
    names = ENGINE_METRICS[kind]
    kv: float | None = None
    running = waiting = hits = queries = ratio = capacity = None
    ttft: dict[float, float] = {}
    caches: dict[str, float] = {}  # engine label -> its KV cache (one sample per engine)

    def add(current: float | None, value: float) -> float:
        return value if current is None else current + value

    for name, labels, value in read_samples(text, names.sample_names):
        if name in names.kv_usage:
            kv = value if kv is None else max(kv, value)
        elif name == names.running:
            running = add(running, value)
        elif name == names.waiting:
            waiting = add(waiting, value)
        elif name == names.prefix_hits:
            hits = add(hits, value)
        elif name == names.prefix_queries:
            queries = add(queries, value)
        elif name == names.prefix_hit_rate:
            ratio = value if ratio is None else max(ratio, value)
        elif name == names.ttft_bucket:
            upper = float(labels["le"])
            ttft[upper] = ttft.get(upper, 0.0) + value
        elif name == names.cache_tokens:
            capacity = add(capacity, value)
        elif name == names.cache_info:
            # Several data-parallel engines behind one server add up; the same engine
            # seen twice (a server of several processes) does not.
            engine = labels.get("engine", "")
            caches[engine] = max(caches.get(engine, 0.0), _cache_tokens(labels))
    hit_rate = hits / queries if hits is not None and queries else ratio
    if caches:
        capacity = add(capacity, sum(caches.values()))
    return EngineSnapshot(
        kv, running, waiting, hit_rate, tuple(sorted(ttft.items())), capacity or None, hits, queries
    )


# One label pair of the text exposition format: name="value", the value's \\ \" \n escaped.
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def read_samples(text: str, wanted: frozenset[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of `text` whose name is wanted.

    vLLM's /metrics is ~600 lines (~50 KB) of which slogate reads ~30: prometheus_client's
    parser took ~20 ms on the whole of it (2.4 ms on the wanted lines alone), a step that
    held the event loop each scrape of each engine, 2.3 s once on a starved machine. The
    wanted lines are read here, names first: comments and other families cost a find()."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            if name not in wanted:
                continue
            close = line.rfind("}")
            labels = {
                key: _unescape(value) for key, value in _LABEL.findall(line, brace + 1, close)
            }
            fields = line[close + 1 :].split()
        else:
            name = line[:space]
            if name not in wanted:
                continue
            labels, fields = {}, line[space + 1 :].split()
        if not fields:
            raise ValueError(f"no value on the sample line {line[:80]!r}")
        yield name, labels, float(fields[0])  # float() reads NaN, +Inf, -Inf too


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], value)


def _cache_tokens(labels: Mapping[str, str]) -> float:
    """vLLM's `cache_config_info` labels: its KV blocks times their size in tokens."""
    try:
        return float(labels.get("num_gpu_blocks", "0")) * float(labels.get("block_size", "0"))
    except ValueError:
        return 0.0


def parse_vllm_metrics(text: str) -> EngineSnapshot:
    return parse_engine_metrics(text, EngineKind.VLLM)


def histogram_quantile(buckets: Iterable[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile of cumulative `buckets`
    (conservative: never under-reports); None when empty. The +Inf bucket reads as its
    lower neighbour's bound doubled: past the histogram, but finite."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank = q * total
    previous = 0.0
    for upper, cumulative in ordered:
        if cumulative >= rank:
            return upper if math.isfinite(upper) else 2 * previous
        previous = upper
    return None


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
        # endpoint -> its TTFT histograms over the last `history_s` (time read, buckets)
        self._ttft: dict[tuple[str, str, int], deque[tuple[float, tuple[tuple[float, float], ...]]]]
        self._ttft = {}
        self.history_s = 600.0
        self._started_s = clock()

    def record(self, pool: str, host: str, port: int, snapshot: EngineSnapshot) -> None:
        now_s = self._clock()
        self._latest[(pool, host, port)] = (now_s, snapshot)
        if snapshot.ttft_buckets:
            history = self._ttft.setdefault((pool, host, port), deque())
            history.append((now_s, snapshot.ttft_buckets))
            while history and history[0][0] < now_s - self.history_s:
                history.popleft()

    def forget_out(self) -> None:
        """Drop the TTFT history of every endpoint that is not one of `endpoints` now (out
        of its pool: dead, hung, draining). Its first tokens while out are its own business
        — a hung engine's stuck requests get theirs when it answers again, seconds late —
        and once back it counts from its return, as a restarted one does."""
        serving = {(pool, h, p) for pool, eps in self.endpoints().items() for h, p in eps}
        for key in [k for k in self._ttft if k not in serving]:
            del self._ttft[key]

    def ttft_quantile_s(
        self, pool: str, q: float, window_s: float, min_samples: int
    ) -> float | None:
        """The q-quantile of the first tokens the pool's engines produced over about the
        last `window_s` (between each endpoint's latest scrape at least that old, or its
        first, and its latest), all endpoints merged; None with fewer than `min_samples` of them. An
        engine that restarted (its counts went down) counts from its restart."""
        now_s = self._clock()
        merged: dict[float, float] = {}
        for host, port in self.endpoints().get(pool, ()):
            history = self._ttft.get((pool, host, port))
            if not history or now_s - history[-1][0] > self.stale_after_s:
                continue
            older = [buckets for t, buckets in history if t <= now_s - window_s]
            base = older[-1] if older else history[0][1]
            if base is history[-1][1]:
                continue  # one scrape so far: no interval to count first tokens in
            latest, earlier = dict(history[-1][1]), dict(base)
            if any(latest.get(upper, 0.0) < count for upper, count in earlier.items()):
                earlier = {}  # restarted since: its counts are all new
            for upper, count in latest.items():
                merged[upper] = merged.get(upper, 0.0) + count - earlier.get(upper, 0.0)
        if not merged or max(merged.values()) < min_samples:
            return None
        return histogram_quantile(merged.items(), q)

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

    def latest(self, pool: str, host: str, port: int) -> tuple[float, EngineSnapshot] | None:
        """The endpoint's latest snapshot and its age in seconds; None before the first."""
        seen = self._latest.get((pool, host, port))
        return None if seen is None else (self._clock() - seen[0], seen[1])

    def snapshot(self, pool: str, host: str, port: int) -> EngineSnapshot | None:
        seen = self._latest.get((pool, host, port))
        return None if seen is None else seen[1]
