"""A refit end to end on a synthetic record: the 09:00 class ramp is foreseen, and a
`learn: true` calendar event's multiple is learned from the same entries."""

from __future__ import annotations

import datetime as dt

import pytest

from forecast.refit import RefitSettings, history_window, refit
from forecast.seasonal import Model
from forecast.seasonal_outlook import SeasonalOutlook
from policy._ahead import AheadConfig, CalendarEvent
from sim.fleet.synthetic_weeks import MONDAY_S, WEEKLY_TENANTS, expected_multiple, synthetic_weeks

DAY_S = 86400.0


def test_history_window_starts_at_a_midnight_and_ends_at_the_last_whole_bin() -> None:
    settings = RefitSettings(history_days=14, bin_s=300)
    now = MONDAY_S + 15 * DAY_S + 8.5 * 3600 + 100
    assert history_window(now, settings) == (MONDAY_S + DAY_S, now - 100)


def test_the_class_ramp_is_foreseen_from_two_weeks_of_record() -> None:
    school = [shape for shape in WEEKLY_TENANTS if shape.tenant == "school"]
    entries = synthetic_weeks(seed=3, days=16, tenants=school, holiday_days=())
    settings = RefitSettings(history_days=15, bin_s=300, held_back_days=7, ahead_s=DAY_S)
    now = MONDAY_S + 15 * DAY_S + 8.5 * 3600  # Tuesday of the third week, 08:30
    done = refit([e for e in entries if e.t < now], now, settings)
    fitted = done.forecasts["school"]
    assert fitted.model in (Model.HOLT_WINTERS_WEEKLY, Model.SEASONAL_NAIVE)
    expected = SeasonalOutlook(done.forecasts).expected("school", now, now + 1800)
    assert expected is not None and expected.reason == "forecast"
    # 8x at 09:00 against 1.5x-of-night at 08:30 (a noisy 5-minute bin: half of it is plenty).
    assert expected.multiple > 4
    assert done.entries > 0 and done.left_out == 0


def test_the_refit_hands_back_the_learned_multiples_of_the_calendar() -> None:
    school = [shape for shape in WEEKLY_TENANTS if shape.tenant == "school"]
    entries = synthetic_weeks(seed=5, days=8, tenants=school, holiday_days=())
    weekdays = frozenset(range(5))
    calendar = AheadConfig(
        events=(
            CalendarEvent("class", ("school",), 60.0, None, at=dt.time(9), days=weekdays),
            CalendarEvent("nobody", ("absent",), 60.0, None, at=dt.time(9), days=weekdays),
            CalendarEvent("declared", ("school",), 60.0, 3.0, at=dt.time(9), days=weekdays),
        )
    )
    now = MONDAY_S + 7 * DAY_S + 12 * 3600  # the second Monday, noon: six classes recorded
    settings = RefitSettings(history_days=7, bin_s=3600, held_back_days=1, ahead_s=DAY_S)
    done = refit([e for e in entries if e.t < now], now, settings, calendar=calendar)
    # The generator's own truth over the same six occurrences (09:00-10:00 UTC).
    classes = [MONDAY_S + day * DAY_S + 9 * 3600 for day in (0, 1, 2, 3, 4, 7)]
    truth = expected_multiple(school[0], [(s, s + 3600) for s in classes], days=8, holiday_days=())
    assert 5 < truth < 8  # the hour before holds the five minutes of ramp
    # Only the learned event with demand to learn from; a declared multiple is not learned.
    assert set(done.learned) == {"class"}
    assert done.learned["class"] == pytest.approx(truth, rel=0.15)
    assert refit(entries, now, settings).learned == {}  # no calendar: nothing learned
