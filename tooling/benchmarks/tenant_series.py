"""`slogate bench tenant-series`: what capping the tenant labels costs per request, and
what it saves in series.

Measured, in this process (no network):
- ns per `TenantSeries.label()` (the count and the fold), for one tenant sent again and
  again and for 10,000 distinct tenants in turn at the default cap of 1,000 (9,000 of them
  fold into `other`);
- ns per request of the metrics a request touches with a tenant label (budget decision,
  tenant tokens, tenant TTFT), through the folded families, against the unfolded Family
  they replaced (one tenant: the old path had no fold to pay for);
- the re-rank's time with a full table (what the 60 s loop holds the event loop for);
- the tenant label values per family and the exposition's lines after 10,000 distinct
  tenants, folded (cap 1,000) and unfolded.
Each timing is the best of `rounds` rounds. Writes bench/results/tenant_series.md and .json.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extproc.service.loop_metrics import Family
from extproc.service.metrics import _LATENCY_BUCKETS_S, SidecarMetrics
from extproc.service.tenant_series import TABLE_FACTOR, TenantSeries
from tooling.benchmarks.reports import write_report

CAP = 1000
DISTINCT = 10_000


def _best_ns(work: Callable[[], None], calls: int, rounds: int) -> float:
    """The fastest round's ns per call (`work` makes `calls` calls)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter_ns()
        work()
        best = min(best, (time.perf_counter_ns() - started) / calls)
    return round(best, 1)


def _label_costs(calls: int, rounds: int) -> dict[str, float]:
    one = TenantSeries(CAP)
    many = TenantSeries(CAP)
    tenants = [f"org-{i}" for i in range(DISTINCT)]
    stream = [tenants[i % DISTINCT] for i in range(calls)]
    fixed = ["acme"] * calls

    def send(series: TenantSeries, names: list[str]) -> Callable[[], None]:
        label = series.label

        def run() -> None:
            for name in names:
                label(name)

        return run

    def empty() -> None:
        for _ in fixed:
            pass

    loop_ns = _best_ns(empty, calls, rounds)  # the for loop alone, taken off below
    return {
        "loop_ns": loop_ns,
        "one_tenant_ns": round(_best_ns(send(one, fixed), calls, rounds) - loop_ns, 1),
        "distinct_10k_ns": round(_best_ns(send(many, stream), calls, rounds) - loop_ns, 1),
    }


def _request_costs(calls: int, rounds: int) -> dict[str, float]:
    """The three tenant-labelled updates of one request: folded (SidecarMetrics) vs the
    unfolded Family of before."""
    folded = SidecarMetrics()
    r = CollectorRegistry()
    decisions = Family(Counter("d", "d", ["tenant", "result"], registry=r))
    tokens = Family(Counter("t", "t", ["tenant"], registry=r))
    # The same buckets as slogate_tenant_ttft_seconds: observe() walks them.
    ttft = Family(Histogram("f", "f", ["tenant"], buckets=_LATENCY_BUCKETS_S, registry=r))
    tenants = [f"org-{i}" for i in range(DISTINCT)]
    stream = [tenants[i % DISTINCT] for i in range(calls)]
    fixed = ["acme"] * calls

    def unfolded() -> None:
        for name in fixed:
            decisions(name, "ok").inc()
            tokens(name).inc(100)
            ttft(name).observe(0.2)

    def through(metrics: SidecarMetrics, names: list[str]) -> Callable[[], None]:
        def run() -> None:
            for name in names:
                metrics.budget_decisions(name, "ok").inc()
                metrics.tenant_tokens(name).inc(100)
                metrics.tenant_ttft_seconds(name).observe(0.2)

        return run

    return {
        "unfolded_one_tenant_ns": _best_ns(unfolded, calls, rounds),
        "folded_one_tenant_ns": _best_ns(through(folded, fixed), calls, rounds),
        "folded_distinct_10k_ns": _best_ns(through(SidecarMetrics(), stream), calls, rounds),
    }


def _rerank_ms(rounds: int) -> float:
    """A re-rank at the default cap with a full table: CAP places, TABLE_FACTOR x CAP
    counted, every count at least 2 (all compete)."""
    best = float("inf")
    for round_ in range(rounds):
        series = TenantSeries(CAP)
        for i in range(TABLE_FACTOR * CAP):
            name = f"r{round_}-org-{i}"
            series.label(name)
            series.label(name)
        started = time.perf_counter()
        series.rerank(CAP)
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 2)


def _exposition(registry: CollectorRegistry) -> tuple[dict[str, int], int]:
    text = generate_latest(registry).decode()
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "tenant" in sample.labels and not family.name.endswith("_created"):
                values.setdefault(family.name, set()).add(sample.labels["tenant"])
    lines = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {name: len(v) for name, v in sorted(values.items())}, lines


def _series_counts() -> dict[str, Any]:
    folded = SidecarMetrics()
    folded.tenants.rerank(CAP)
    unfolded = SidecarMetrics()
    unfolded.tenants.rerank(DISTINCT * 2)  # a cap no one reaches: the labels as before
    for metrics in (folded, unfolded):
        for i in range(DISTINCT):
            name = f"org-{i}"
            metrics.budget_decisions(name, "ok").inc()
            metrics.tenant_tokens(name).inc(100)
            metrics.tenant_ttft_seconds(name).observe(0.2)
    folded_values, folded_lines = _exposition(folded.registry)
    unfolded_values, unfolded_lines = _exposition(unfolded.registry)
    return {
        "folded_tenant_values": folded_values,
        "folded_exposition_lines": folded_lines,
        "unfolded_tenant_values": unfolded_values,
        "unfolded_exposition_lines": unfolded_lines,
    }


def run(out_dir: Path, calls: int = 200_000, rounds: int = 5) -> dict[str, Any]:
    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cap": CAP,
        "distinct_tenants": DISTINCT,
        "calls": calls,
        "rounds": rounds,
        "label": _label_costs(calls, rounds),
        "request": _request_costs(calls, rounds),
        "rerank_full_table_ms": _rerank_ms(rounds),
        "series": _series_counts(),
    }
    label, request, series = report["label"], report["request"], report["series"]
    lines = [
        "| measure | value |",
        "| --- | ---: |",
        f"| `label()`, one tenant, ns per call | {label['one_tenant_ns']} |",
        f"| `label()`, {DISTINCT:,} distinct tenants in turn, ns per call | "
        f"{label['distinct_10k_ns']} |",
        f"| a request's 3 tenant series, unfolded Family (before), one tenant, ns | "
        f"{request['unfolded_one_tenant_ns']} |",
        f"| a request's 3 tenant series, folded, one tenant, ns | "
        f"{request['folded_one_tenant_ns']} |",
        f"| a request's 3 tenant series, folded, {DISTINCT:,} tenants in turn, ns | "
        f"{request['folded_distinct_10k_ns']} |",
        f"| re-rank, {CAP} places, {TABLE_FACTOR * CAP} counted, ms | "
        f"{report['rerank_full_table_ms']} |",
        f"| exposition lines after {DISTINCT:,} tenants, folded | "
        f"{series['folded_exposition_lines']} |",
        f"| exposition lines after {DISTINCT:,} tenants, unfolded | "
        f"{series['unfolded_exposition_lines']} |",
    ]
    for name, count in series["folded_tenant_values"].items():
        unfolded = series["unfolded_tenant_values"].get(name)
        lines.append(f"| `{name}` tenant values, folded / unfolded | {count} / {unfolded} |")
    table = "\n".join(lines)
    write_report(
        out_dir,
        "tenant_series",
        report,
        f"# Tenant label cap: cost per request and series saved ({report['when']})\n\n"
        f"Cap {CAP} (`telemetry.tenant_series_max`'s default), in one process, best of "
        f"{rounds} rounds of {calls:,} calls (the for loop's own "
        f"{label['loop_ns']} ns taken off the `label()` rows).\n\n{table}\n",
    )
    print(table)
    return report
