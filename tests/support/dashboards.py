"""The Grafana dashboards' queries as Prometheus runs them: every target of every panel of
deploy/grafana/*.json (rows' nested panels too), with Grafana's variables expanded the way
the dashboard's "All" does, and how to tell a query that may legitimately have no value on
a quiet stack (a ratio of rates: 0/0) from one that has no series at all."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tooling.stack.prometheus_api import PrometheusApi

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))

# Grafana's own interval variables: with a 1 s scrape, $__rate_interval is 4 s (four
# scrapes); 10 s is what the scaled rules read too, steadier and still well inside a run.
_INTERVALS = re.compile(
    r"\$(?:\{__(?:rate_interval|interval|range)\}|__(?:rate_interval|interval|range)\b)"
)
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_RATES = re.compile(r"\b(?:rate|irate|increase|stddev_over_time|stdvar_over_time)\s*\(")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*:[a-zA-Z0-9_:]*")  # recorded names hold a colon


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str  # as written in the dashboard
    query: str  # expanded: what is sent to Prometheus

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel}: {self.query}"


def _panels(panels: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its own


def expand(expr: str, variables: dict[str, str], window: str) -> str:
    """Grafana's interpolation for the dashboard at "All": `$tier`, `${tenant}`,
    `[[tier]]` -> the variable's all-value (its regex `.*`); interval variables -> `window`.
    A variable the dashboard does not define is left as written (Prometheus rejects it:
    the test names the panel)."""
    expr = _INTERVALS.sub(window, expr)

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return variables.get(name, match.group(0))

    return _VARIABLE.sub(value, expr)


def panel_queries(window: str = "10s", paths: Sequence[Path] = DASHBOARDS) -> list[PanelQuery]:
    """Every Prometheus target of every panel (a datasource variable needs no expansion:
    the query goes to the one Prometheus)."""
    queries = []
    for path in paths:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        variables = {
            v["name"]: v.get("allValue") or ".*"
            for v in dashboard.get("templating", {}).get("list", [])
            if v.get("type") != "datasource"
        }
        for panel in _panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if expr:
                    queries.append(
                        PanelQuery(
                            path.name,
                            panel.get("title", f"panel {panel.get('id')}"),
                            expr,
                            expand(expr, variables, window),
                        )
                    )
    return queries


def recorded(rules: Path) -> dict[str, str]:
    """A rules file's recording rules: the recorded name -> its expression."""
    groups = yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
    return {r["record"]: str(r["expr"]) for g in groups for r in g["rules"] if "record" in r}


def unfold(expr: str, records: dict[str, str], depth: int = 8) -> str:
    """`expr` with every recorded series it reads replaced by the recording rule's own
    expression (recursively): its form is the form of what it records."""
    for _ in range(depth):
        unfolded = _NAME.sub(
            lambda m: f"({records[m.group(0)]})" if m.group(0) in records else m.group(0), expr
        )
        if unfolded == expr:
            return expr
        expr = unfolded
    return expr


def divides_rates(expr: str) -> bool:
    """A query whose value is a ratio of rates, which has no value while nothing moves:
    a division whose divisor holds a rate()/increase() (or a standard deviation over time,
    0 for a flat series), or a histogram_quantile() of rates (a quantile of an empty
    histogram is NaN). Read from the query's form (unfold recorded series first), not from
    a list."""
    if "histogram_quantile" in expr and _RATES.search(expr):
        return True
    return any(
        ch == "/" and _RATES.search(_operand_after(expr, i + 1)) is not None
        for i, ch in enumerate(expr)
    )


def _operand_after(expr: str, at: int) -> str:
    """The right operand of a binary operator at `at`: up to the end of the enclosing
    parentheses (a division binds tighter than what may follow, but reading to the close of
    its group is enough to see whether the divisor holds a rate)."""
    depth = 0
    for j in range(at, len(expr)):
        if expr[j] == "(":
            depth += 1
        elif expr[j] == ")":
            if depth == 0:
                return expr[at:j]
            depth -= 1
    return expr[at:]


def has_data(api: PrometheusApi, query: str, from_s: float, to_s: float, step_s: float) -> bool:
    """Some series of `query` had a number (not NaN) at some step between the two times."""
    return any(
        not math.isnan(value)
        for series in api.query_range(query, from_s, to_s, step_s)
        for _, value in series.points
    )
