"""The dashboards' queries as the live test sends them (tests/support/dashboards.py): every
panel's targets, Grafana's variables expanded, and which ones are ratios of rates."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.dashboards import divides_rates, expand, panel_queries, unfold


def test_variables_expand_as_the_dashboard_at_all_does() -> None:
    variables = {"tenant": ".*", "tier": ".*"}
    expr = 'rate(x{tenant=~"$tenant",tier=~"${tier}"}[$__rate_interval]) + y{t=~"[[tier]]"}'
    assert expand(expr, variables, "10s") == ('rate(x{tenant=~".*",tier=~".*"}[10s]) + y{t=~".*"}')
    assert expand("z{a=~'$unknown'}", variables, "10s") == "z{a=~'$unknown'}"


def test_ratios_of_rates_are_told_by_their_form() -> None:
    assert divides_rates("sum(rate(a_sum[5m])) / sum(rate(b_sum[5m]))")
    assert divides_rates("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))")
    assert divides_rates("(cov) / on (pool) (stddev_over_time(x[30m]) >= 0.02)")
    assert not divides_rates("sum by (pool) (rate(a_total[5m]))")
    assert not divides_rates("max by (pool) (slogate_breaker_level) / 3")
    assert not divides_rates("slogate_kv_in_flight_tokens")
    # A recorded series has the form of the rule that records it.
    records = {"r:hit_rate": "sum(rate(h[5m])) / sum(rate(q[5m]))", "r:pair": "r:hit_rate * 2"}
    assert divides_rates(unfold("r:pair", records))
    assert not divides_rates(unfold("r:pair", {"r:pair": "sum(x)"}))


def test_every_target_of_every_panel_is_found_rows_included(tmp_path: Path) -> None:
    dashboard = {
        "templating": {"list": [{"name": "tier", "type": "custom", "allValue": ".*"}]},
        "panels": [
            {"title": "a", "targets": [{"expr": 'x{tier=~"$tier"}'}, {"expr": "y"}]},
            {"title": "row", "type": "row", "panels": [{"title": "b", "targets": [{"expr": "z"}]}]},
            {"title": "text", "type": "text"},
        ],
    }
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dashboard))
    found = [(q.panel, q.query) for q in panel_queries(paths=[path])]
    assert found == [("a", 'x{tier=~".*"}'), ("a", "y"), ("b", "z")]
    assert len(panel_queries()) >= 25  # the shipped dashboard's
