"""Sliding-window histograms: quantiles from merged counts, windows that forget, no data = None."""

from __future__ import annotations

import numpy as np
import pytest

from breaker.latency import LogHistogram, ResponseWindows
from tests.support.clock import VirtualClock


def test_quantiles_match_numpy_within_bin_resolution() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=-1.0, sigma=0.8, size=20_000)
    histogram = LogHistogram()
    for v in values:
        histogram.record(float(v))
    for q in (0.5, 0.95, 0.99):
        got = histogram.quantile(q)
        want = float(np.quantile(values, q))
        assert got is not None
        assert want <= got <= want * 1.06, (q, got, want)  # upper bin edge, 5% bins


def test_empty_means_no_data() -> None:
    assert LogHistogram().quantile(0.99) is None
    windows = ResponseWindows(VirtualClock(1000.0))
    assert windows.merged("ttft", 60).quantile(0.99) is None
    assert windows.error_rate("default", 60) is None


def test_merge_adds_counts() -> None:
    a, b = LogHistogram(), LogHistogram()
    a.record(0.1)
    b.record(10.0)
    b.record(10.0)
    a.merge(b)
    assert a.total == 3
    assert a.quantile(0.34) == pytest.approx(10.0, rel=0.06)


def test_windows_forget_old_slots_and_filter_by_label() -> None:
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock, slot_s=10, horizon_s=300)
    windows.record_latency("ttft", "default", "critical", "0-4k", 5.0)  # an old spike
    clock.now_s += 120
    for _ in range(100):
        windows.record_latency("ttft", "default", "critical", "0-4k", 0.2)
        windows.record_latency("ttft", "long", "sheddable", "32k-128k", 2.0)
    one_min = windows.merged("ttft", 60, pool="default").quantile(1.0)
    five_min = windows.merged("ttft", 300, pool="default").quantile(1.0)
    assert one_min is not None and one_min < 0.25
    assert five_min is not None and five_min >= 5.0
    long_p50 = windows.merged("ttft", 60, tier="sheddable").quantile(0.5)
    assert long_p50 == pytest.approx(2.0, rel=0.06)
    clock.now_s += 400  # past the horizon: everything is gone
    assert windows.merged("ttft", 300).quantile(0.5) is None


def test_error_rate_per_pool() -> None:
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    for status in (200, 200, 200, 500):
        windows.record_response("default", status)
    windows.record_response("long", 503)
    assert windows.error_rate("default", 60) == pytest.approx(0.25)
    assert windows.error_rate("long", 60) == 1.0


def test_bad_window_shape_is_refused() -> None:
    with pytest.raises(ValueError):
        ResponseWindows(VirtualClock(1000.0), slot_s=10, horizon_s=5)


def test_a_time_past_every_bin_goes_in_the_last() -> None:
    """Found by the fuzzer: a TTFT of 1e305 s (an access-log tag of "1e308" ms) overflowed
    the bin arithmetic (OverflowError on int(inf))."""
    histogram = LogHistogram()
    for value_s in (1e305, float("inf"), 5000.0):
        histogram.record(value_s)
    assert histogram.total == 3 and histogram.counts[-1] == 3
