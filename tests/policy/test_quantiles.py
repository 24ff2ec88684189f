"""The one quantile rule (policy.quantiles): nearest rank, at its edges."""

from __future__ import annotations

import math

import pytest

from breaker.latency import LogHistogram
from policy.quantiles import nearest_rank, quantile


def test_no_samples_is_the_callers_to_say() -> None:
    with pytest.raises(ValueError, match="no samples"):
        quantile([], 0.99)
    assert quantile([], 0.99, empty=None) is None
    assert math.isnan(quantile([], 0.5, empty=math.nan))


def test_one_sample_is_every_quantile() -> None:
    assert [quantile([7.0], q) for q in (0.0, 0.01, 0.5, 0.99, 1.0)] == [7.0] * 5


def test_exact_ranks_are_the_sample_at_that_rank() -> None:
    hundred = [float(v) for v in range(100, 0, -1)]  # order does not matter
    assert quantile(hundred, 0.99) == 99.0  # 99 of 100 at or below it
    assert quantile(hundred, 0.5) == 50.0  # the lower middle, a value measured
    assert quantile(hundred, 0.07) == 7.0  # 0.07 * 100 is 7.000000000000001 in floats
    assert quantile(hundred, 0.0) == 1.0 and quantile(hundred, 1.0) == 100.0
    # Between ranks, the next one up: never under-reports.
    assert quantile(hundred, 0.991) == 100.0
    assert quantile([1.0, 2.0], 0.5) == 1.0 and quantile([1.0, 2.0], 0.51) == 2.0


def test_the_rank_and_its_bounds() -> None:
    assert [nearest_rank(0.99, n) for n in (1, 2, 100, 101, 150, 1000)] == [
        1,
        2,
        99,
        100,
        149,
        990,
    ]
    for q in (-0.01, 1.01):
        with pytest.raises(ValueError, match="not within"):
            nearest_rank(q, 10)


def test_the_breakers_histogram_reads_by_the_same_rank() -> None:
    histogram = LogHistogram()
    samples = [0.01 * (i + 1) for i in range(100)]
    for value in samples:
        histogram.record(value)
    for q in (0.5, 0.9, 0.99):
        exact = quantile(samples, q)
        read = histogram.quantile(q)
        assert read is not None and exact <= read <= exact * 1.06  # its bin's upper edge
