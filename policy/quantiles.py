"""What "the P99" means in slogate: the one quantile rule, for every part that reports one.

The rule is nearest rank: the q-quantile of n samples is the sample of rank ceil(q * n) in
increasing order (1-based, at least 1). So it is always a value that was measured, never one
interpolated between two, and at least a share q of the samples are at or below it: a
latency objective (`ttft_p99_ms`) is met by the P99 only where 99% of requests met it. The
breaker reads its latency histograms by the same rank (breaker.latency.LogHistogram), so the
simulator's, the load test's, the benches' and calibration's P99 mean what the breaker's
decisions mean.

Lives in `policy/`, the bottom layer, because the objectives the policy states are P99s and
every layer above reads them. Two figures keep numpy's interpolation on purpose, being
inputs rather than reported figures: the workload fit's quantile tables (points of a
distribution drawn from by interpolating between them) and the quota controller's P95 of
recent consumption (a smooth ceiling over a short history, which nearest rank would pin to
the largest interval's total).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeVar, overload

T = TypeVar("T")

# q * n computed in floating point can land just over a whole number (0.07 * 100 is
# 7.000000000000001); rounding it first keeps exact ranks exact.
_RANK_DIGITS = 9


def nearest_rank(q: float, n: int) -> int:
    """The 1-based rank of the q-quantile among `n` ordered samples (n >= 1)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within [0, 1]")
    if n < 1:
        raise ValueError("no samples")
    return min(n, max(1, math.ceil(round(q * n, _RANK_DIGITS))))


_NO_DEFAULT: Any = object()


@overload
def quantile(values: Iterable[float], q: float) -> float: ...
@overload
def quantile(values: Iterable[float], q: float, *, empty: T) -> float | T: ...
def quantile(values: Iterable[float], q: float, *, empty: Any = _NO_DEFAULT) -> Any:
    """The q-quantile of `values` by nearest rank. No values: `empty` when given (as
    `max(..., default=)`), else ValueError: what no samples means is the caller's to say."""
    ordered = sorted(values)
    if not ordered and empty is not _NO_DEFAULT:
        return empty
    return ordered[nearest_rank(q, len(ordered)) - 1]
