"""Sliding-window latency histograms and response counts, fed once per finished request.

What lives here: `LogHistogram` (fixed log-spaced bins, mergeable by adding counts) and
`ResponseWindows`, a ring of per-slot histograms per (metric, pool, tier, bucket) plus
per-pool response / 5xx counts. Quantiles come from merged counts, never from averages.
Pure arithmetic with an injected clock: no I/O, no threads.

"No data" is explicit: a quantile over an empty window is None, and the breaker decides
what None means for its signal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from policy.quantiles import nearest_rank

# Bins grow by 5% from 0.5 ms to ~20 min: quantiles are exact to within ~2.5%.
_MIN_S = 0.0005
_MAX_S = 1200.0
_GROWTH = 1.05
_BINS = math.ceil(math.log(_MAX_S / _MIN_S) / math.log(_GROWTH)) + 1
_LOG_GROWTH = math.log(_GROWTH)


def _bin_of(value_s: float) -> int:
    if value_s <= _MIN_S:
        return 0
    if not value_s < _MAX_S:  # the last bin, before any arithmetic: 1e305 s overflowed
        return _BINS - 1
    return min(_BINS - 1, int(math.log(value_s / _MIN_S) / _LOG_GROWTH) + 1)


def _bin_upper_s(index: int) -> float:
    return float(_MIN_S * _GROWTH**index)


class LogHistogram:
    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = np.zeros(_BINS, dtype=np.int64)

    def record(self, value_s: float) -> None:
        self.counts[_bin_of(value_s)] += 1

    def merge(self, other: LogHistogram) -> None:
        self.counts += other.counts

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile by the project's rank rule
        (policy.quantiles: nearest rank; conservative, never under-reports)."""
        total = self.total
        if total == 0:
            return None
        index = int(np.searchsorted(np.cumsum(self.counts), nearest_rank(q, total)))
        return _bin_upper_s(index)


SeriesKey = tuple[str, str, str, str]  # metric, pool, tier, bucket
# The series the breaker reads: each finished request's latency / its objective
# (breaker.objectives), dimensionless; 1.0 is on the SLO.
SLO_RATIO = "slo_ratio"


@dataclass
class _Slot:
    start_s: float
    histograms: dict[SeriesKey, LogHistogram]
    responses: dict[str, int]  # pool -> count
    errors: dict[str, int]  # pool -> 5xx count
    # (pool, engine) -> (responses, 5xx) of the answers an engine gave: what the pool's
    # counts lose while that engine is out (engines.state.EngineFleet.out).
    engines: dict[tuple[str, str], list[int]] = field(default_factory=dict)


class ResponseWindows:
    """The last `horizon_s` of finished requests, in slots of `slot_s` seconds."""

    def __init__(
        self, clock: Callable[[], float], slot_s: float = 10.0, horizon_s: float = 300.0
    ) -> None:
        if slot_s <= 0 or horizon_s < slot_s:
            raise ValueError("need 0 < slot_s <= horizon_s")
        self._clock = clock
        self._slot_s = slot_s
        self._slots: list[_Slot] = []
        self._max_slots = math.ceil(horizon_s / slot_s)

    @classmethod
    def covering(cls, window_s: float, clock: Callable[[], float]) -> ResponseWindows:
        """The windows a breaker of `window_s` reads: slots fine enough that it forgets a
        spike within ~1/6 of its window, kept for 5 minutes at least."""
        return cls(clock, slot_s=min(10.0, window_s / 6), horizon_s=max(300.0, window_s))

    def _current(self) -> _Slot:
        now = self._clock()
        start = math.floor(now / self._slot_s) * self._slot_s
        if not self._slots or self._slots[-1].start_s != start:
            self._slots.append(_Slot(start, {}, {}, {}))
            del self._slots[: -self._max_slots]
        return self._slots[-1]

    def _within(self, window_s: float) -> list[_Slot]:
        oldest = self._clock() - window_s
        return [s for s in self._slots if s.start_s + self._slot_s > oldest]

    def record_latency(
        self, metric: str, pool: str, tier: str, bucket: str, value_s: float
    ) -> None:
        slot = self._current()
        key = (metric, pool, tier, bucket)
        histogram = slot.histograms.get(key)
        if histogram is None:
            histogram = slot.histograms[key] = LogHistogram()
        histogram.record(value_s)

    def record_response(self, pool: str, status: int, engine: str = "") -> None:
        slot = self._current()
        slot.responses[pool] = slot.responses.get(pool, 0) + 1
        failed = status >= 500
        if failed:
            slot.errors[pool] = slot.errors.get(pool, 0) + 1
        if engine:
            counts = slot.engines.setdefault((pool, engine), [0, 0])
            counts[0] += 1
            counts[1] += failed

    def merged(
        self,
        metric: str,
        window_s: float,
        pool: str | None = None,
        tier: str | None = None,
        bucket: str | None = None,
    ) -> LogHistogram:
        """One histogram over the window; a label left as None matches every value."""
        merged = LogHistogram()
        for slot in self._within(window_s):
            for (m, p, t, b), histogram in slot.histograms.items():
                if m == metric and pool in (None, p) and tier in (None, t) and bucket in (None, b):
                    merged.merge(histogram)
        return merged

    def response_counts(
        self, pool: str | None, window_s: float, leave_out: frozenset[str] = frozenset()
    ) -> tuple[int, int]:
        """(responses, 5xx) of a pool in the window; None sums every pool. `leave_out`:
        engines of `pool` whose answers do not count (engines taken out of it)."""
        responses = errors = 0
        for slot in self._within(window_s):
            if pool is None:
                responses += sum(slot.responses.values())
                errors += sum(slot.errors.values())
            else:
                responses += slot.responses.get(pool, 0)
                errors += slot.errors.get(pool, 0)
                for engine in leave_out:
                    counts = slot.engines.get((pool, engine))
                    if counts is not None:
                        responses -= counts[0]
                        errors -= counts[1]
        return responses, errors

    def error_rate(self, pool: str, window_s: float) -> float | None:
        """Share of 5xx among the pool's responses in the window; None without responses."""
        slots = self._within(window_s)
        responses = sum(s.responses.get(pool, 0) for s in slots)
        if responses == 0:
            return None
        return sum(s.errors.get(pool, 0) for s in slots) / responses
