"""The shipped rules with their time scaled (tooling.render.alert_rules), for the live alert run:
the same rules, only shorter. promtool's verdict: tests/e2e/tooling/render/test_alert_rules.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tooling.render.alert_rules import (
    SHIPPED_RULES,
    duration_s,
    promql_duration,
    scale_expr,
    scaled_rules,
)


def _rules(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        rule.get("alert") or rule["record"]: rule
        for group in document["groups"]
        for rule in group["rules"]
    }


def test_windows_offsets_and_subqueries_scale_but_quoted_regexes_do_not() -> None:
    expr = 'rate(x{t=~"[a-z]+[5m]"}[5m]) / max_over_time(y[30m:1m] offset 1h) + z[1d:]'
    assert scale_expr(expr, 1 / 60, 0.0) == (
        'rate(x{t=~"[a-z]+[5m]"}[5s]) / max_over_time(y[30s:1s] offset 60s) + z[1440s:]'
    )
    # No window under the floor (a rate needs a few scrapes); offsets have none.
    assert scale_expr("rate(a[1m]) offset 1m", 1 / 60, 10.0) == "rate(a[10s]) offset 1s"
    assert promql_duration(7.5) == "7500ms" and promql_duration(90) == "90s"


def test_every_shipped_rule_is_kept_with_its_time_scaled_and_nothing_else_changed() -> None:
    shipped = _rules(yaml.safe_load(SHIPPED_RULES.read_text()))
    scaled = _rules(scaled_rules(1 / 60, 10.0))
    assert scaled.keys() == shipped.keys() and any(n.startswith("Slogate") for n in shipped)
    windows = re.compile(r"\[[0-9smhdwy:]+\]|offset \d+\w+")
    for name, rule in shipped.items():
        mine = scaled[name]
        if "for" in rule:
            assert duration_s(mine["for"]) == pytest.approx(duration_s(rule["for"]) / 60), name
        # Only the windows differ: the rest of the expression is the shipped text.
        assert windows.sub("W", mine["expr"]) == windows.sub("W", rule["expr"]), name
        assert {k: v for k, v in mine.items() if k not in ("for", "expr")} == {
            k: v for k, v in rule.items() if k not in ("for", "expr")
        }, name
        for window in re.findall(r"\[(\d+\w+?)[\]:]", mine["expr"]):
            assert duration_s(window) >= 10.0, (name, window)
