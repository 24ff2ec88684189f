"""The static-vs-dynamic comparison on the offline fleet.

What lives here: `compare`, which runs the same workload and seed with (a) the best static
per-tier quota found by a sweep and (b) slogate's dynamic controller, `gains` and `table`
(its report). Workload files are sim.fleet.workload_files', a run's summary
sim.fleet.run_summary's, running the fleet sim.fleet.fleet_runs'; the waiting room's and
the sidecars' comparisons are sim.studies.room_reports'.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from policy.domain import Tier
from sim.fleet.fleet_runs import run_many, run_once, with_kv_admission
from sim.fleet.workload_files import Workload
from sim.server.model import LatencyConfig
from sim.studies.room_reports import _percent

SWEEP = {"standard": (0.25, 0.5, 0.75, 1.0), "sheddable": (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)}
CRITICAL_ATTAINMENT = 0.99  # what a careful operator holds the critical tier to


def _rank(report: dict[str, Any]) -> tuple[bool, float, float]:
    """A careful operator's choice: the critical tier within its SLO first, then goodput."""
    critical = report["tiers"]["critical"]
    meets = (critical["slo_attainment"] or 0.0) >= CRITICAL_ATTAINMENT
    return (meets, report["goodput_tokens_per_s"], -(critical["p99_ttft_s"] or math.inf))


def compare(
    workload: Workload,
    seed: int = 7,
    latency: LatencyConfig | None = None,
    sweep_grid: Mapping[str, tuple[float, ...]] = SWEEP,
    processes: int = 1,
) -> dict[str, Any]:
    """The best static per-tier quota (a sweep, as a careful operator would tune it) against
    slogate's dynamic control, same workload and seed. Also reported: the static quota as
    contracted (every multiplier 1.0, what most fleets run) and the controller without KV
    admission, so each part's share of the difference shows. `latency`: a measured model
    (`slogate calibrate`) instead of the field's numbers, for every run alike. `processes`:
    the independent runs (the sweep, dynamic, controller only) side by side."""
    engine: dict[str, Any] = {} if latency is None else {"latency": latency}
    grid = [
        {"critical": 1.0, "standard": standard, "sheddable": sheddable}
        for standard, sheddable in itertools.product(
            sweep_grid["standard"], sweep_grid["sheddable"]
        )
    ]
    specs = [(workload, seed, {"fixed_multipliers": m, **engine}) for m in grid]
    specs.append(
        (with_kv_admission(workload), seed, {"timeline": True, "controller": True, **engine})
    )
    specs.append((workload, seed, {"controller": True, **engine}))
    *reports, dynamic, controller_only = run_many(specs, processes)
    sweep = [{"multipliers": m, "report": r} for m, r in zip(grid, reports, strict=True)]
    best = max(sweep, key=lambda row: _rank(row["report"]))
    # Re-run for its timeline: on the same engine model as the sweep that chose it.
    best_report = run_once(
        workload, seed, timeline=True, fixed_multipliers=best["multipliers"], **engine
    )
    contract = next((row for row in sweep if set(row["multipliers"].values()) == {1.0}), None)
    if contract is None:  # a grid without the contracted point: run it, never mislabel
        unscaled = {tier.value: 1.0 for tier in Tier}
        report = run_once(workload, seed, fixed_multipliers=unscaled, **engine)
        contract = {"multipliers": unscaled, "report": report}
    return {
        "workload": workload.name,
        "seed": seed,
        "selection": f"critical SLO attainment >= {CRITICAL_ATTAINMENT}, then goodput",
        "bursts": workload.bursts,
        "static_best": {"multipliers": best["multipliers"], "report": best_report},
        "static_contract": contract,
        "dynamic": dynamic,
        "controller_only": controller_only,
        "sweep": sweep,
    }


def gains(comparison: dict[str, Any]) -> dict[str, float | None]:
    """Dynamic against the best static quota, as the issue's goal states them."""
    static, dynamic = comparison["static_best"]["report"], comparison["dynamic"]

    def relative(a: float | None, b: float | None) -> float | None:
        return None if not a or b is None else round(b / a - 1.0, 4)

    return {
        "utilisation_relative": relative(static["gpu_utilisation"], dynamic["gpu_utilisation"]),
        "goodput_relative": relative(
            static["goodput_tokens_per_s"], dynamic["goodput_tokens_per_s"]
        ),
        "critical_p99_relative": relative(
            static["tiers"]["critical"]["p99_ttft_s"], dynamic["tiers"]["critical"]["p99_ttft_s"]
        ),
        "burst_handling_static": static["burst_handling"],
        "burst_handling_dynamic": dynamic["burst_handling"],
        "oom_events_dynamic": dynamic["oom_events"],
    }


# The field's published result of dynamic against static quotas (/work/shared/DESIGN.md,
# "Numbers from the field"): GPU utilisation, P99 latency, burst handling (bursts served).
FIELD = {"utilisation": (0.41, 0.68), "p99_ms": (920, 650), "burst_handling": (0.3, 0.8)}


def field_table(comparison: dict[str, Any]) -> str:
    """The field's three rows, static -> dynamic, with this comparison's beside them: the
    best static quota of the sweep against slogate's dynamic control. The field names one
    P99; ours are per tier (P99 TTFT of the critical and the standard tier)."""
    static, dynamic = comparison["static_best"]["report"], comparison["dynamic"]

    def p99_ms(report: dict[str, Any], tier: str) -> str:
        value = report["tiers"][tier]["p99_ttft_s"]
        return "-" if value is None else f"{value * 1000:.0f}"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    u, p, b = FIELD["utilisation"], FIELD["p99_ms"], FIELD["burst_handling"]
    seed = comparison["seed"]
    return "\n".join(
        [
            f"| metric | field: static -> dynamic | ours (seed {seed}): static -> dynamic |",
            "| --- | --- | --- |",
            f"| GPU utilisation | {u[0]:.0%} -> {u[1]:.0%} | "
            f"{share(static['gpu_utilisation'])} -> {share(dynamic['gpu_utilisation'])} |",
            f"| P99 latency ms (ours: TTFT, critical / standard) | {p[0]} -> {p[1]} | "
            f"{p99_ms(static, 'critical')} / {p99_ms(static, 'standard')} -> "
            f"{p99_ms(dynamic, 'critical')} / {p99_ms(dynamic, 'standard')} |",
            f"| burst handling (served within SLO) | {b[0] * 10:.0f}/10 -> {b[1] * 10:.0f}/10 | "
            f"{share(static['burst_handling'])} -> {share(dynamic['burst_handling'])} |",
        ]
    )


def table(comparison: dict[str, Any]) -> str:
    columns = [
        ("static (contract, 1.0)", comparison["static_contract"]["report"]),
        ("static (best sweep)", comparison["static_best"]["report"]),
        ("controller only", comparison["controller_only"]),
        ("dynamic (slogate)", comparison["dynamic"]),
    ]

    def row(label: str, value: Any) -> str:
        return f"| {label} | " + " | ".join(str(value(r)) for _, r in columns) + " |"

    lines = [
        f"workload {comparison['workload']} (seed {comparison['seed']}); best static quota "
        f"({comparison['selection']}): {comparison['static_best']['multipliers']}",
        "| metric | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " --- |" * len(columns),
        row("goodput tokens/s", lambda r: r["goodput_tokens_per_s"]),
        row("GPU utilisation (busiest pool)", lambda r: r["gpu_utilisation"]),
        row("burst handling", lambda r: r["burst_handling"]),
        row("OOM events", lambda r: r["oom_events"]),
    ]
    for tier in ("critical", "standard", "sheddable"):
        lines.append(row(f"{tier} P99 TTFT s", lambda r, t=tier: r["tiers"][t]["p99_ttft_s"]))
        lines.append(
            row(f"{tier} P99 / objective", lambda r, t=tier: r["tiers"][t]["p99_over_objective"])
        )
        lines.append(
            row(f"{tier} SLO attainment", lambda r, t=tier: r["tiers"][t]["slo_attainment"])
        )
        lines.append(row(f"{tier} refused", lambda r, t=tier: r["tiers"][t]["refused"]))
    g = gains(comparison)
    lines.append(
        f"dynamic vs best static: utilisation {_percent(g['utilisation_relative'])}, goodput "
        f"{_percent(g['goodput_relative'])}, critical P99 {_percent(g['critical_p99_relative'])}"
        f", burst handling {g['burst_handling_static']} -> {g['burst_handling_dynamic']}, "
        f"OOM events under dynamic control: {g['oom_events_dynamic']}"
    )
    lines += ["", "Against the field's published result:", "", field_table(comparison)]
    lending = loan_summary(comparison["dynamic"])
    if lending:
        lines += ["", lending]
    return "\n".join(lines)


def loan_summary(report: dict[str, Any]) -> str:
    """What was lent of the KV reserve in the busiest pool (budget.lending), from the moves
    a run with a timeline records: each borrower's mean loan over the run and its moves."""
    moves = report.get("kv_lending") or []
    if not moves:
        return ""
    by_pool = report["utilisation_by_pool"]
    pool = max(by_pool, key=lambda name: by_pool[name])
    timeline = report.get("timeline") or []
    span_s = timeline[-1]["at_s"] if timeline else None
    parts = []
    for borrower in ("standard", "sheddable"):
        mine = [(t, value) for t, _, what, value in moves if what == f"kv_lend:{borrower}:{pool}"]
        if not mine:
            continue
        end_s = span_s or mine[-1][0]
        held = sum(
            value * (min(end_s, (mine[i + 1][0] if i + 1 < len(mine) else end_s)) - t)
            for i, (t, value) in enumerate(mine)
        )
        calls = sum(1 for i in range(1, len(mine)) if mine[i][1] < mine[i - 1][1])
        parts.append(
            f"{borrower}: mean {held / end_s:.3f} of the pool lent, at most "
            f"{max(v for _, v in mine):.2f}, {len(mine)} moves ({calls} called back)"
        )
    return f"KV reserve lent in pool {pool!r} (budget.lending): " + "; ".join(parts)
