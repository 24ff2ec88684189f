from __future__ import annotations

import pytest

from extproc.service.traffic_read import TrafficEntry
from forecast.demand import demand_series, request_tokens

T0 = 1_793_577_600.0


def entry(at_s: float, tenant: str | None = "a", **fields: object) -> TrafficEntry:
    shape: dict[str, object] = {
        "outcome": "admitted",
        "prompt": 100,
        "max_tokens": 50,
        "bucket": "short",
    }
    shape.update(fields)
    return TrafficEntry(v=1, t=at_s, tenant=tenant, **shape)  # type: ignore[arg-type]


def test_a_request_counts_its_usage_else_what_its_budget_reserved() -> None:
    assert request_tokens(entry(T0, usage_prompt=120, usage_completion=30), 2.0) == 300.0
    # No usage (refused, or no usage reported): the counted prompt + every completion's limit.
    assert request_tokens(entry(T0, n=2), 1.0) == 100 + 2 * 50
    assert request_tokens(entry(T0, outcome="refused", prompt=None), 1.0) == 0.0


def test_demand_is_binned_per_tenant_as_weighted_tokens_and_requests_per_minute() -> None:
    entries = [
        entry(T0 + 10, usage_prompt=100, usage_completion=20),  # 120 x 3
        entry(T0 + 200, usage_prompt=40, usage_completion=0, bucket="long"),  # 40 x 1 (unknown)
        entry(T0 + 400, tenant="b", usage_prompt=60, usage_completion=0),  # bin 1 of b
        entry(T0 + 700, usage_prompt=1, usage_completion=0),  # past the last whole bin
        entry(T0 - 1, usage_prompt=1, usage_completion=0),  # before the start
        entry(T0 + 20, tenant=None),  # no tenant: left out
    ]
    series = demand_series(
        entries, bin_s=300, start_s=T0, end_s=T0 + 650, cost_weight={"short": 3.0}
    )
    assert sorted(series) == ["a", "b"]
    a, b = series["a"], series["b"]
    # Two whole bins of 5 minutes: the rate per minute is the bin's sum / 5.
    assert a.tokens_per_minute == pytest.approx((((120 * 3) + 40) / 5, 0.0))
    assert a.requests_per_minute == pytest.approx((2 / 5, 0.0))
    assert b.tokens_per_minute == pytest.approx((0.0, 60 * 3 / 5))
    assert a.end_s == T0 + 600 and a.bins_per_day() == 288


def test_a_bin_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bin_s"):
        demand_series([], bin_s=0, start_s=T0, end_s=T0 + 1)
