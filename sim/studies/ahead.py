"""Quotas ahead of time, measured: reactive only vs with a forecast vs with the calendar vs wrong.

What lives here: the arms of the three studies (`ramp_arms`, `sharp_arms`, `week_arms`) and
their calendars, `run_arm` (one arm on the offline fleet: the sidecar's planner,
budget.ahead, stepped in the fleet's controller) and `table` (one table per workload, each
arm beside its baseline from the same run). The workloads and their calendar time are
sim.studies.ahead_workloads', the forecasts the arms know sim.studies.ahead_outlooks'.
Nothing here writes: `slogate simulate --ahead` does.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import datetime as dt
import multiprocessing
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from budget.ahead import AheadPlanner, reason_label
from forecast.calendar import CalendarClock, CalendarFirst, CalendarOutlook
from forecast.outlook import Outlook
from policy._ahead import AheadConfig, CalendarEvent, Holiday
from policy.domain import Tier
from sim.fleet.fleet_runs import run_fleet, with_kv_admission
from sim.fleet.run_summary import summarize, within_objective
from sim.fleet.workload_files import SIMULATION_POLICY, Workload, workload_from
from sim.studies.ahead_outlooks import OnCalendarClock, ShapeOutlook, fitted_week_forecast
from sim.studies.ahead_workloads import (
    DAY_S,
    HOUR_S,
    RAMP_ORIGIN,
    SHARP_ORIGIN,
    WEEK_ORIGIN,
    WEEK_SCALE,
    ZONE,
    ramp_document,
    sharp_never_document,
    sharp_ramp_document,
    week_document,
)

MORNING_H = (8.0, 11.0)  # the weekday mornings whose attainment the night's lending must keep
NIGHT_H = (0.0, 7.0)


@dataclass(frozen=True, slots=True)
class Arm:
    """One run: what the fleet plays and what the controller knows."""

    name: str
    workload: str  # "ramp", "ramp-never" / "week", "week-late", "week-quiet-wed"
    outlook: str  # "", "forecast", "calendar", "forecast+calendar"
    lend: float = 1.0
    baseline: str = ""  # the arm this one is read against (same run)


RAMP_CALENDAR = AheadConfig(
    lead_min=3.0,
    grace_min=3.0,
    timezone=ZONE,
    events=(
        CalendarEvent(
            "class-start", ("classes",), 10.0, 8.0, at=dt.time(9, 5), days=frozenset(range(5))
        ),
    ),
)
# A grace of an hour: the fitted forecast's bins are an hour long, so it expects the 08:30
# ramp from 07:00 (the 08:00 bin holds half of it), up to an hour before it comes.
WEEK_CALENDAR = AheadConfig(
    lead_min=60.0,
    grace_min=60.0,
    timezone=ZONE,
    events=(
        CalendarEvent(
            "office-opens", ("office",), 90.0, 8.0, at=dt.time(8, 30), days=frozenset(range(5))
        ),
    ),
)
# Declared in the combined arm only: the week's Wednesday off, which the forecast did not see.
WEDNESDAY_OFF = Holiday("wednesday-off", frozenset({dt.date(2026, 12, 2)}))


def ramp_arms() -> list[Arm]:
    return [
        Arm("reactive only", "ramp", ""),
        Arm("with the forecast", "ramp", "forecast", baseline="reactive only"),
        Arm("with the calendar", "ramp", "calendar", baseline="reactive only"),
        Arm("reactive only, ramp never comes", "ramp-never", ""),
        Arm(
            "wrong forecast: ramp never comes",
            "ramp-never",
            "forecast",
            baseline="reactive only, ramp never comes",
        ),
        Arm(
            "wrong calendar: ramp never comes",
            "ramp-never",
            "calendar",
            baseline="reactive only, ramp never comes",
        ),
    ]


def sharp_arms() -> list[Arm]:
    return [
        Arm("reactive only", "sharp", ""),
        Arm("with the forecast", "sharp", "forecast", baseline="reactive only"),
        Arm("with the calendar", "sharp", "calendar", baseline="reactive only"),
        Arm("reactive only, ramp never comes", "sharp-never", ""),
        Arm(
            "wrong calendar: ramp never comes",
            "sharp-never",
            "calendar",
            baseline="reactive only, ramp never comes",
        ),
    ]


def week_arms() -> list[Arm]:
    return [
        Arm("reactive only", "week", ""),
        Arm("with the forecast, nothing lent", "week", "forecast", baseline="reactive only"),
        Arm("with the forecast, idle hours lent (x3)", "week", "forecast", 3.0, "reactive only"),
        Arm("with the calendar", "week", "calendar", baseline="reactive only"),
        Arm("reactive only, ramp an hour late", "week-late", ""),
        Arm(
            "wrong forecast: ramp an hour late",
            "week-late",
            "forecast",
            1.0,
            "reactive only, ramp an hour late",
        ),
        Arm("reactive only, Wednesday's ramp never comes", "week-quiet-wed", ""),
        Arm(
            "wrong forecast: Wednesday's ramp never comes",
            "week-quiet-wed",
            "forecast",
            1.0,
            "reactive only, Wednesday's ramp never comes",
        ),
        Arm(
            "forecast + calendar (Wednesday declared a holiday)",
            "week-quiet-wed",
            "forecast+calendar",
            1.0,
            "reactive only, Wednesday's ramp never comes",
        ),
    ]


SHARP_CALENDAR = AheadConfig(
    lead_min=0.5,
    grace_min=1.0,
    timezone=ZONE,
    events=(
        CalendarEvent(
            "class-start", ("classes",), 2.0, 8.0, at=dt.time(9, 0), days=frozenset(range(5))
        ),
    ),
)


def _documents(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the fleet plays, what the forecast was fitted to)."""
    if name.startswith("sharp"):
        return (sharp_never_document() if name == "sharp-never" else sharp_ramp_document()), (
            sharp_ramp_document()
        )
    if name.startswith("ramp"):
        return ramp_document(name == "ramp-never"), ramp_document(False)
    actual = {
        "week": week_document(),
        "week-late": week_document(late_h=1.0),
        "week-quiet-wed": week_document(quiet_days=(2,)),
    }[name]
    return actual, week_document()


def _planner(arm: Arm, fitted: dict[str, Any]) -> AheadPlanner | None:
    if not arm.outlook:
        return None
    family = arm.workload.split("-")[0]
    calendar_config, clock = {
        "ramp": (RAMP_CALENDAR, CalendarClock(RAMP_ORIGIN, 1.0)),
        "sharp": (SHARP_CALENDAR, CalendarClock(SHARP_ORIGIN, 1.0)),
        "week": (WEEK_CALENDAR, CalendarClock(WEEK_ORIGIN, WEEK_SCALE)),
    }[family]
    config = dataclasses.replace(calendar_config, lend=arm.lend)
    if arm.outlook == "forecast+calendar":
        config = dataclasses.replace(config, holidays=(WEDNESDAY_OFF,))
    # The week's forecast is the seasonal fit on weeks before it; the ramps' (minutes long,
    # no weeks of history) the workload's declared rates, a perfect forecast.
    forecast: Outlook = (
        OnCalendarClock(fitted_week_forecast(), clock) if family == "week" else ShapeOutlook(fitted)
    )
    calendar = CalendarOutlook(config, clock)
    outlooks: dict[str, Outlook] = {
        "forecast": forecast,
        "calendar": calendar,
        "forecast+calendar": CalendarFirst(calendar, forecast),
    }
    outlook = outlooks[arm.outlook]
    return AheadPlanner.from_config(config, outlook, clock.time_scale)


# The per-key dynamic budgets enforced (breaker.controller_key_budgets), as the field's
# controller does: a key's ceiling follows its own recent consumption, which is what lags
# a ramp. Every arm of a workload runs under the same policy.
KEY_BUDGETS_POLICY: dict[str, Any] = copy.deepcopy(SIMULATION_POLICY)
KEY_BUDGETS_POLICY["breaker"]["controller_key_budgets"] = True
# The classes' contract: what the full class may use (20/s x ~2,300 tokens x 60 s).
CLASSES_TOKENS_PER_MINUTE = 3_000_000


def _with_contract(raw: dict[str, Any]) -> dict[str, Any]:
    for tenant in raw["tenants"]:
        if tenant["tenant"] in ("classes", "office"):
            tenant["limits"] = {**tenant["limits"], "tokens_per_minute": CLASSES_TOKENS_PER_MINUTE}
    return raw


def _fleet_workload(raw: dict[str, Any], seed: int) -> Workload:
    return with_kv_admission(
        workload_from(_with_contract(raw), KEY_BUDGETS_POLICY, seed, source=raw["name"])
    )


def _hours(at_s: float) -> tuple[int, float]:
    return int(at_s // DAY_S), (at_s % DAY_S) / HOUR_S


def run_arm(arm: Arm, seed: int = 11) -> dict[str, Any]:
    actual, fitted = _documents(arm.workload)
    workload = with_kv_admission(
        workload_from(actual, SIMULATION_POLICY, seed, source=arm.workload)
    )
    fleet, results = run_fleet(workload, seed, controller=True, ahead=_planner(arm, fitted))
    report = summarize(fleet, results, workload)
    row: dict[str, Any] = {
        "arm": arm.name,
        "baseline": arm.baseline,
        "critical_attainment": report["tiers"]["critical"]["slo_attainment"],
        "standard_attainment": report["tiers"]["standard"]["slo_attainment"],
        "sheddable_attainment": report["tiers"]["sheddable"]["slo_attainment"],
        "burst_handling": report["burst_handling"],
        "utilisation": report["gpu_utilisation"],
        "goodput_tokens_per_s": report["goodput_tokens_per_s"],
        "oom_events": report["oom_events"],
        "moves": dict(Counter(reason_label(m.reason) for m in fleet.ahead_moves)),
    }
    if arm.workload.startswith("week"):
        policy = workload.policy
        for tier in (Tier.CRITICAL, Tier.STANDARD):
            morning = [
                r
                for r in results.values()
                if r.arrival.key.tier is tier
                and _hours(r.arrival.at_s)[0] < 5
                and MORNING_H[0] <= _hours(r.arrival.at_s)[1] < MORNING_H[1]
            ]
            met = sum(within_objective(policy, r) for r in morning)
            row[f"morning_{tier.value}_attainment"] = (
                round(met / len(morning), 4) if morning else None
            )
        pool = fleet.busiest_pool()
        nights = [
            s.kv_usage[pool]
            for s in fleet.timeline
            if NIGHT_H[0] <= _hours(s.at_s)[1] < NIGHT_H[1] and s.at_s < workload.duration_s
        ]
        row["night_kv_usage"] = round(float(np.mean(nights)), 4) if nights else None
    return row


def run_arms(arms: Sequence[Arm], seed: int = 11, processes: int = 1) -> list[dict[str, Any]]:
    if processes <= 1:
        return [run_arm(arm, seed) for arm in arms]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        return list(pool.map(run_arm, arms, [seed] * len(arms)))


COLUMNS = (
    ("critical_attainment", "critical attainment"),
    ("burst_handling", "burst handling"),
    ("utilisation", "utilisation"),
    ("goodput_tokens_per_s", "goodput tok/s"),
    ("sheddable_attainment", "sheddable attainment"),
    ("oom_events", "OOM"),
)
WEEK_COLUMNS = (
    ("morning_critical_attainment", "morning critical"),
    ("morning_standard_attainment", "morning standard"),
    ("night_kv_usage", "night KV use"),
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown table; each row with a baseline shows the goodput against it."""
    week = any("night_kv_usage" in r for r in rows)
    columns = COLUMNS + (WEEK_COLUMNS if week else ())
    header = (
        "| arm | " + " | ".join(title for _, title in columns) + " | goodput vs baseline | moves |"
    )
    lines = [header, "|" + " --- |" * (len(columns) + 3)]
    by_name = {r["arm"]: r for r in rows}
    for row in rows:
        base = by_name.get(row["baseline"])
        ratio = ""
        if base and base["goodput_tokens_per_s"]:
            ratio = f"{row['goodput_tokens_per_s'] / base['goodput_tokens_per_s']:.3f}x"
        moves = ", ".join(f"{k} {v}" for k, v in sorted(row["moves"].items())) or "-"
        cells = " | ".join(str(row.get(key)) for key, _ in columns)
        lines.append(f"| {row['arm']} | {cells} | {ratio or 'baseline'} | {moves} |")
    return "\n".join(lines)
