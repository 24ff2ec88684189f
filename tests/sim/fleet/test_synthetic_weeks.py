from __future__ import annotations

from pathlib import Path

from extproc.service.traffic_read import read_traffic
from sim.fleet.synthetic_weeks import MONDAY_S, synthetic_weeks, write_record

DAY_S = 86400.0
HOUR_S = 3600.0


def count(entries: list, tenant: str, day: int, from_h: float, to_h: float) -> int:
    low, high = MONDAY_S + day * DAY_S + from_h * HOUR_S, MONDAY_S + day * DAY_S + to_h * HOUR_S
    return sum(1 for e in entries if e.tenant == tenant and low <= e.t < high)


def test_the_record_is_seeded_and_has_the_weekly_shape() -> None:
    # Monday to Sunday, the Wednesday (day 2) a holiday.
    entries = synthetic_weeks(seed=5, days=7, holiday_days=(2,), scale=0.5)
    one_day = synthetic_weeks(seed=5, days=1, scale=0.1)
    assert one_day == synthetic_weeks(seed=5, days=1, scale=0.1)
    assert one_day != synthetic_weeks(seed=6, days=1, scale=0.1)
    assert [e.t for e in entries] == sorted(e.t for e in entries)
    # The bank: business hours far above its nights and its weekend; a holiday is a day off.
    monday_peak = count(entries, "bank", 0, 10, 12)
    assert monday_peak > 5 * count(entries, "bank", 0, 0, 2)
    assert monday_peak > 3 * count(entries, "bank", 5, 10, 12)  # Saturday
    assert monday_peak > 3 * count(entries, "bank", 2, 10, 12)  # the holiday
    # The school: the five minutes before 09:00 far above the five before them.
    ramp = count(entries, "school", 1, 8 + 55 / 60, 9)
    assert ramp > 2 * count(entries, "school", 1, 8 + 50 / 60, 8 + 55 / 60)
    assert count(entries, "school", 1, 9, 10) > 5 * count(entries, "school", 1, 11, 12)
    # Batch at night every day; steady all the time.
    assert count(entries, "batch", 6, 1, 3) > 4 * count(entries, "batch", 6, 12, 14)
    steady = [count(entries, "steady", day, 0, 24) for day in range(7)]
    assert max(steady) < 1.2 * min(steady)


def test_the_record_is_written_as_the_sidecar_writes_it(tmp_path: Path) -> None:
    entries = synthetic_weeks(seed=1, days=2, scale=0.05)
    assert write_record(entries, tmp_path) == 2  # a file per UTC day
    read = read_traffic([tmp_path])
    assert read.problems == [] and read.entries == entries
