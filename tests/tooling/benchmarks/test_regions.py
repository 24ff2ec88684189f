"""The regions lab's summaries (tooling.benchmarks.regions_readings), on made-up shots and
samples."""

from __future__ import annotations

import pytest

from tooling.benchmarks.regions_readings import (
    Sample,
    Shot,
    has_metric,
    labelled,
    mean_share_sum,
    overshoot,
    read_sample,
    seconds_to_share,
    states_seen,
)
from tooling.stack.regions import GLOBAL_KEY


def test_overshoot_counts_the_global_tenants_answered_tokens_in_the_window() -> None:
    shots = [
        Shot("a", "eu", GLOBAL_KEY, 1.0, 200, tokens=1000),
        Shot("a", "us", GLOBAL_KEY, 20.0, 200, tokens=1000),
        Shot("a", "us", GLOBAL_KEY, 25.0, 429),  # refused: nothing admitted
        Shot("a", "us", "sk-demo-batch", 5.0, 200, tokens=5000),  # another tenant
        Shot("a", "eu", GLOBAL_KEY, 30.0, 200, tokens=1000),  # after the window
    ]
    # 2000 tokens in 30 s = 4000 a minute, against a limit of 2000 a minute.
    assert overshoot(shots, 0.0, 30.0, 2000) == 2.0


def test_time_to_share_and_the_states_a_region_went_through() -> None:
    samples = [
        Sample(10.0, "eu", 0.3, "leased", 0.0, None),
        Sample(10.5, "us", 0.95, "leased", 0.0, None),
        Sample(11.0, "eu", 0.6, "cut_off", 0.0, None),
        Sample(12.5, "eu", 0.92, "cut_off", 0.0, None),
        Sample(14.0, "eu", 0.92, "fallback", 0.0, None),
        Sample(15.0, "eu", 0.92, "leased", 0.0, None),
    ]
    assert seconds_to_share(samples, "eu", 10.0, 0.9) == 2.5
    assert seconds_to_share(samples, "eu", 10.0, 0.99) is None
    assert states_seen(samples, "eu", 10.5, 20.0) == ["cut_off", "fallback", "leased"]
    # eu held 0.3, 0.6 and 0.92 in [10, 13), us 0.95.
    assert mean_share_sum(samples, 10.0, 13.0) == pytest.approx((0.3 + 0.6 + 0.92) / 3 + 0.95)


def test_a_metrics_page_is_read_and_a_missing_metric_is_none() -> None:
    page = (
        "# TYPE slogate_region_lease_share gauge\n"
        'slogate_region_lease_share{tenant="demo-global"} 0.5\n'
        "# TYPE slogate_region_ledger_state gauge\n"
        'slogate_region_ledger_state{state="leased"} 1\n'
        'slogate_region_ledger_state{state="fallback"} 0\n'
    )
    got = read_sample(page, 3.0, "eu", "demo-global")
    assert (got.share, got.state, got.usage, got.crossed) == (0.5, "leased", None, None)
    assert has_metric(page, "slogate_region_ledger_state")
    assert not has_metric(page, "slogate_region_crossed")
    counter = "# TYPE slogate_region_crossed_total counter\n"
    counter += 'slogate_region_crossed_total{peer="eu",tier="sheddable"} 3.0\n'
    counter += 'slogate_region_crossed_total{peer="us",tier="sheddable"} 1.0\n'
    assert has_metric(counter, "slogate_region_crossed")
    assert labelled(counter, "slogate_region_crossed_total", "peer") == {"eu": 3.0, "us": 1.0}
