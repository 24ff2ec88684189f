"""The workloads of the quotas-ahead study, and the calendar time they are played in.

What lives here: the calendar origins (the ramp on a Monday at 09:00 in `ZONE`, the week from
Monday 00:00) and the compressed day (`DAY_S` simulated seconds, `WEEK_SCALE` calendar seconds
each); `week_document` (a week of daily traffic with a weekly shape: the source of
sim/workloads/week-daily.yaml, and of its variants with the morning ramp an hour late or a
day whose ramp never comes), `sharp_ramp_document` (the class start in 10 s beside long
sheddable reports), `ramp_document` (class-start-ramp, or its ramp that never comes) and
`sharp_never_document`. Documents only: sim.studies.ahead plays them.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Sequence
from typing import Any

from sim.fleet.workload_files import ramp_never_comes, workload_path

ZONE = "Europe/Paris"
# The ramp workload starts on a Monday at 09:00 in ZONE; the week at Monday 00:00.
RAMP_ORIGIN = dt.datetime(2026, 11, 30, 9, 0, tzinfo=zoneinfo.ZoneInfo(ZONE)).timestamp()
WEEK_ORIGIN = dt.datetime(2026, 11, 30, 0, 0, tzinfo=zoneinfo.ZoneInfo(ZONE)).timestamp()
DAY_S = 360.0  # a simulated day: an hour plays in 15 s, the week in 42 minutes
HOUR_S = DAY_S / 24
WEEK_SCALE = 86_400.0 / DAY_S  # calendar seconds per simulated second
SHARP_ORIGIN = RAMP_ORIGIN - 60.0  # the sharp ramp's sim 60 s is 09:01


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


def ramp_document(never: bool) -> dict[str, Any]:
    """class-start-ramp, or the same traffic whose ramp never comes."""
    import yaml

    raw: dict[str, Any] = yaml.safe_load(workload_path("class-start-ramp").read_text())
    return ramp_never_comes(raw) if never else raw


def sharp_never_document() -> dict[str, Any]:
    return ramp_never_comes(sharp_ramp_document())
