"""Quotas ahead of time, measured: reactive only vs with a forecast vs with the calendar vs wrong.

What lives here: `fitted_week_forecast` (the seasonal fit, forecast.refit, on weeks recorded
before the simulated one), `ShapeOutlook` (a forecast read off a workload's own declared
rates: a perfect one, for the ramps minutes long that have no weeks of history), `week_document`
(a week of daily traffic with a weekly shape, a day played in `DAY_S` seconds: the source
of sim/workloads/week-daily.yaml, and of its variants with the morning ramp an hour late
or a day whose ramp never comes), `sharp_ramp_document` (the class start in 10 s beside
long sheddable reports), the arms of the three studies (`ramp_arms`, `sharp_arms`,
`week_arms`), `run_arm` (one arm on the offline fleet: the sidecar's planner,
budget.ahead, stepped in the fleet's controller) and `table` (one table per workload, each
arm beside its baseline from the same run). Nothing here writes: `slogate simulate --ahead` does.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import datetime as dt
import functools
import multiprocessing
import zoneinfo
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from budget.ahead import AheadPlanner, reason_label
from forecast.calendar import CalendarClock, CalendarFirst, CalendarOutlook
from forecast.outlook import Expected, Outlook
from forecast.refit import RefitSettings, refit
from forecast.seasonal_outlook import SeasonalOutlook
from policy._ahead import AheadConfig, CalendarEvent, Holiday
from policy.domain import Tier
from sim.fleet.fleet_runs import run_fleet, with_kv_admission
from sim.fleet.run_summary import summarize, within_objective
from sim.fleet.workload_files import SIMULATION_POLICY, Workload, workload_from, workload_path

ZONE = "Europe/Paris"
# The ramp workload starts on a Monday at 09:00 in ZONE; the week at Monday 00:00.
RAMP_ORIGIN = dt.datetime(2026, 11, 30, 9, 0, tzinfo=zoneinfo.ZoneInfo(ZONE)).timestamp()
WEEK_ORIGIN = dt.datetime(2026, 11, 30, 0, 0, tzinfo=zoneinfo.ZoneInfo(ZONE)).timestamp()
DAY_S = 360.0  # a simulated day: an hour plays in 15 s, the week in 42 minutes
HOUR_S = DAY_S / 24
WEEK_SCALE = 86_400.0 / DAY_S  # calendar seconds per simulated second
MORNING_H = (8.0, 11.0)  # the weekday mornings whose attainment the night's lending must keep
NIGHT_H = (0.0, 7.0)


@dataclass(frozen=True, slots=True)
class _Recorded:
    """An arrival as the traffic record would have it (forecast.demand.RecordedRequest)."""

    t: float
    tenant: str | None
    prompt: int | None
    max_tokens: int
    bucket: str | None = None
    n: int = 1
    usage_prompt: int | None = None
    usage_completion: int | None = None


PRIOR_WEEKS = 3


@functools.lru_cache(maxsize=1)
def fitted_week_forecast(seed: int = 11) -> SeasonalOutlook:
    """The seasonal forecast (forecast.refit: Holt-Winters weekly / daily x weekday vs seasonal
    naive, the best per tenant on the held-back week) fitted on PRIOR_WEEKS weeks of the
    usual week (`week_document`, other seeds) recorded before the simulated one, in calendar
    time: what `slogate serve` would have refitted at the week's start."""
    entries: list[_Recorded] = []
    for back in range(1, PRIOR_WEEKS + 1):
        week = workload_from(week_document(), SIMULATION_POLICY, seed * 100 + back, source="prior")
        start_s = WEEK_ORIGIN - back * 7 * 86_400.0
        entries += [
            _Recorded(start_s + a.at_s * WEEK_SCALE, a.key.tenant, a.prompt_tokens, a.max_tokens)
            for a in week.arrivals
        ]
    # Hourly bins: a day played in 6 min puts a few requests in a 5-minute bin, and their
    # noise read as ramps (a quiet tenant's 1 request against 3: "3x").
    settings = RefitSettings(
        history_days=7 * PRIOR_WEEKS, bin_s=3600.0, held_back_days=7, ahead_s=8 * 86_400.0
    )
    return SeasonalOutlook(refit(entries, WEEK_ORIGIN, settings).forecasts)


class OnCalendarClock:
    """An outlook on Unix seconds asked in the simulator's: its clock mapped to the calendar's."""

    def __init__(self, outlook: Outlook, clock: CalendarClock) -> None:
        self.outlook = outlook
        self.clock = clock

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        return self.outlook.expected(tenant, self.clock.unix(now_s), self.clock.unix(at_s))


class ShapeOutlook:
    """The rates a workload document declares, as a forecast (reason "forecast"): a tenant's
    demand at `at_s` over its demand at `now_s`. `shift_s`: the forecast that much early
    (the ramp comes that much later than forecast)."""

    def __init__(self, raw: dict[str, Any], shift_s: float = 0.0) -> None:
        self._streams: dict[str, list[tuple[float, float, float, list[float], list[float]]]] = {}
        self.shift_s = shift_s
        duration_s = float(raw["duration_s"])
        for tenant in raw["tenants"]:
            for stream in tenant["streams"]:
                shape = stream.get("shape") or [[0.0, 1.0], [duration_s, 1.0]]
                self._streams.setdefault(tenant["tenant"], []).append(
                    (
                        float(stream["rate_per_s"]),
                        float(stream.get("start_s", 0.0)),
                        float(stream.get("end_s", duration_s)),
                        [float(t) for t, _ in shape],
                        [float(f) for _, f in shape],
                    )
                )

    def rate(self, tenant: str, at_s: float) -> float:
        at_s += self.shift_s
        return sum(
            rate * float(np.interp(at_s, times, factors))
            for rate, start, end, times, factors in self._streams.get(tenant, [])
            if start <= at_s < end
        )

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        if tenant not in self._streams:
            return None
        now, then = self.rate(tenant, now_s), self.rate(tenant, at_s)
        multiple = then / now if now > 0 else (1.0 if then == 0 else float("inf"))
        return Expected(tenant, at_s, multiple, None, "forecast")


def _day_points(day: int, points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(day * DAY_S + h * HOUR_S, f) for h, f in points]


def week_document(late_h: float = 0.0, quiet_days: Sequence[int] = ()) -> dict[str, Any]:
    """A week, Monday to Sunday: support (critical) follows the working day; office
    (standard) jumps 16x between 08:30 and 09:00 on weekdays and leaves at 17:00-18:00;
    batch (sheddable) always has more work than its static quota lets through. `late_h`:
    the office's morning ramp that many hours later; `quiet_days`: weekdays (0: Monday) on
    which it never comes (a holiday nobody declared to the forecast)."""
    night = 0.06
    support: list[tuple[float, float]] = []
    office: list[tuple[float, float]] = []
    bursts: list[list[float]] = []
    for day in range(7):
        if day >= 5:
            support += _day_points(day, [(0, 0.4), (23.99, 0.4)])
            office += _day_points(day, [(0, night), (23.99, night)])
            continue
        support += _day_points(
            day, [(0, 0.3), (7, 0.3), (9, 1.0), (18, 1.0), (20, 0.3), (23.99, 0.3)]
        )
        if day in quiet_days:
            office += _day_points(day, [(0, night), (23.99, night)])
            continue
        start = 8.5 + late_h
        office += _day_points(
            day,
            [
                (0, night),
                (start, night),
                (start + 0.5, 1.0),
                (17, 1.0),
                (18, night),
                (23.99, night),
            ],
        )
        bursts.append([day * DAY_S + start * HOUR_S, day * DAY_S + (start + 1.5) * HOUR_S])
    return {
        "name": "week-daily",
        "duration_s": 7 * DAY_S,
        "bursts": bursts,
        "burst_tenants": ["office"],
        "tenants": [
            {
                "tenant": "support",
                "tier": "critical",
                "limits": {"concurrent_requests": 32},
                "streams": [
                    {
                        "rate_per_s": 1.5,
                        "prompt_tokens": [500, 2000],
                        "max_tokens": 256,
                        "shape": [list(p) for p in support],
                    }
                ],
            },
            {
                "tenant": "office",
                "tier": "standard",
                "limits": {"concurrent_requests": 160},
                "streams": [
                    {
                        "rate_per_s": 18.0,
                        "prompt_tokens": [1000, 3000],
                        "max_tokens": 256,
                        "shape": [list(p) for p in office],
                    }
                ],
            },
            {
                "tenant": "batch",
                "tier": "sheddable",
                "limits": {"concurrent_requests": 12},
                "streams": [{"rate_per_s": 4.0, "prompt_tokens": [2000, 6000], "max_tokens": 512}],
            },
        ],
    }


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


def sharp_ramp_document() -> dict[str, Any]:
    """Two minutes: classes jump 8x in 10 s at minute 1 (09:01 on the ramp's calendar) while
    long sheddable reports (6-12k prompts, 2,048 tokens out) hold most of the KV cache: a
    reaction frees it only as the reports finish; a raise half a minute ahead has squeezed
    them already."""
    return {
        "name": "class-start-sharp",
        "duration_s": 120,
        "bursts": [[60, 120]],
        "burst_tenants": ["classes"],
        "tenants": [
            {
                "tenant": "support",
                "tier": "critical",
                "limits": {"concurrent_requests": 32},
                "streams": [{"rate_per_s": 1.0, "prompt_tokens": [500, 2000], "max_tokens": 256}],
            },
            {
                "tenant": "classes",
                "tier": "standard",
                "limits": {"concurrent_requests": 160},
                "streams": [
                    {
                        "rate_per_s": 16.0,
                        "prompt_tokens": [1000, 3000],
                        "max_tokens": 256,
                        "shape": [[0, 0.125], [60, 0.125], [70, 1.0], [120, 1.0]],
                    }
                ],
            },
            {
                "tenant": "reports",
                "tier": "sheddable",
                "limits": {"concurrent_requests": 96},
                "streams": [
                    {"rate_per_s": 4.0, "prompt_tokens": [6000, 12000], "max_tokens": 2048}
                ],
            },
        ],
    }


SHARP_ORIGIN = RAMP_ORIGIN - 60.0  # the sharp ramp's sim 60 s is 09:01
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


def _ramp_document(never: bool) -> dict[str, Any]:
    import yaml

    raw: dict[str, Any] = yaml.safe_load(workload_path("class-start-ramp").read_text())
    if never:
        for tenant in raw["tenants"]:
            for stream in tenant["streams"]:
                if "shape" in stream:
                    stream["shape"] = [[0, 0.125], [900, 0.125]]
    return raw


def _sharp_never() -> dict[str, Any]:
    raw = sharp_ramp_document()
    raw["tenants"][1]["streams"][0]["shape"] = [[0, 0.125], [120, 0.125]]
    return raw


def _documents(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the fleet plays, what the forecast was fitted to)."""
    if name.startswith("sharp"):
        return (_sharp_never() if name == "sharp-never" else sharp_ramp_document()), (
            sharp_ramp_document()
        )
    if name.startswith("ramp"):
        return _ramp_document(name == "ramp-never"), _ramp_document(False)
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
