"""The business calendar over time: recurrence on weekdays in the calendar's time zone
(through a daylight-saving change), holidays, one-off events, a multiple learned from
the traffic record, and the calendar over a forecast."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

from forecast.calendar import (
    CalendarClock,
    CalendarFirst,
    CalendarOutlook,
    learn_multiples,
    learned_multiple,
    occurrences,
    outlook_for,
)
from forecast.outlook import Expected
from policy._ahead import AheadConfig, CalendarEvent, Holiday

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
CLASS = CalendarEvent("class", ("classes",), 60.0, 8.0, at=dt.time(9, 0), days=frozenset(range(5)))


def at(*parts: int) -> float:
    return dt.datetime(*parts, tzinfo=PARIS).timestamp()


def test_a_recurring_event_happens_at_its_local_time_on_its_weekdays() -> None:
    # Mon 2026-10-19 .. Sun 2026-11-01; Paris leaves summer time on Sunday 2026-10-25.
    starts = [s for s, _ in occurrences(CLASS, PARIS, at(2026, 10, 19), at(2026, 11, 1))]
    local = [dt.datetime.fromtimestamp(s, PARIS) for s in starts]
    assert [d.date().day for d in local] == [19, 20, 21, 22, 23, 26, 27, 28, 29, 30]
    assert {(d.hour, d.minute) for d in local} == {(9, 0)}  # on the wall, across the change
    # ... so in UTC it moved by the hour the clocks did.
    assert {dt.datetime.fromtimestamp(s, dt.UTC).hour for s in starts} == {7, 8}


def test_a_holiday_suppresses_the_weekday_pattern() -> None:
    holiday = Holiday("armistice", frozenset({dt.date(2026, 11, 11)}))
    other = Holiday("other", frozenset({dt.date(2026, 11, 12)}), suppresses=("another",))
    days = [
        dt.datetime.fromtimestamp(s, PARIS).day
        for s, _ in occurrences(CLASS, PARIS, at(2026, 11, 9), at(2026, 11, 14), [holiday, other])
    ]
    assert days == [9, 10, 12, 13]  # the 11th is off; the 12th's holiday is another event's


def test_a_one_off_event_and_the_outlook_reason() -> None:
    launch = CalendarEvent("launch", ("product",), 120.0, 3.0, on=dt.datetime(2026, 12, 10, 14))
    outlook = CalendarOutlook(AheadConfig(timezone="Europe/Paris", events=(launch, CLASS)))
    assert outlook.expected("product", 0.0, at(2026, 12, 10, 13, 59)) is None
    found = outlook.expected("product", 0.0, at(2026, 12, 10, 15, 0))
    assert found == Expected("product", at(2026, 12, 10, 15, 0), 3.0, None, "calendar:launch")
    assert outlook.expected("product", 0.0, at(2026, 12, 10, 16, 0)) is None  # over
    assert outlook.expected("classes", 0.0, at(2026, 12, 12, 9, 30)) is None  # a Saturday


def test_a_scaled_clock_plays_the_calendar_faster() -> None:
    # The simulator's 0 is Monday 00:00 and one of its seconds is four calendar minutes.
    clock = CalendarClock(at(2026, 11, 30), 240.0)
    outlook = CalendarOutlook(AheadConfig(timezone="Europe/Paris", events=(CLASS,)), clock)
    assert outlook.expected("classes", 0.0, 9 * 15 + 1) is not None  # 09:04 on Monday
    assert outlook.expected("classes", 0.0, 8 * 15) is None  # 08:00


@dataclass(frozen=True)
class Entry:
    t: float
    tenant: str | None
    prompt: int | None = 900
    max_tokens: int = 100
    usage_completion: int | None = None
    bucket: str | None = None
    n: int = 1
    usage_prompt: int | None = None


def test_a_multiple_is_learned_from_past_occurrences() -> None:
    spans = occurrences(CLASS, PARIS, at(2026, 11, 9), at(2026, 11, 11))  # Mon, Tue
    entries = []
    for start, _ in spans:
        entries += [Entry(start - 3600 + i * 360, "classes") for i in range(10)]  # 10 before
        entries += [Entry(start + i * 45, "classes") for i in range(80)]  # 80 during
        entries += [Entry(start + 5, "someone-else")]
    assert learned_multiple(spans, ["classes"], entries) == 8.0
    assert learned_multiple(spans, ["classes"], []) is None  # nothing to learn from
    learned = CalendarEvent("class", ("classes",), 60.0, None, at=dt.time(9), days=CLASS.days)
    config = AheadConfig(timezone="Europe/Paris", events=(learned,))
    assert learn_multiples(config, entries, at(2026, 11, 1), at(2026, 11, 11)) == {"class": 8.0}
    # An occurrence the record holds only in part, or without the hour before it, is not
    # learned from: Monday's class cut at 09:30 would read as a ramp half as large.
    assert learn_multiples(config, entries, at(2026, 11, 9, 8), at(2026, 11, 9, 9, 30)) == {}
    assert learn_multiples(config, entries, at(2026, 11, 9, 8, 30), at(2026, 11, 10)) == {}
    assert CalendarOutlook(config).expected("classes", 0.0, at(2026, 11, 9, 9, 30)) is None
    taught = CalendarOutlook(config, learned={"class": 8.0})
    found = taught.expected("classes", 0.0, at(2026, 11, 9, 9, 30))
    assert found is not None and found.multiple == 8.0


class Forecast:
    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        return Expected(tenant, at_s, 5.0, 1000.0, "forecast")


def test_the_calendar_wins_and_a_holiday_suppresses_the_forecast() -> None:
    holiday = Holiday("armistice", frozenset({dt.date(2026, 11, 11)}))
    config = AheadConfig(timezone="Europe/Paris", events=(CLASS,), holidays=(holiday,))
    outlook = CalendarFirst(CalendarOutlook(config), Forecast())
    declared = outlook.expected("classes", 0.0, at(2026, 11, 10, 9, 30))
    assert declared is not None and declared.reason == "calendar:class"
    forecast = outlook.expected("classes", 0.0, at(2026, 11, 10, 12, 0))
    assert forecast is not None and forecast.reason == "forecast"
    off = outlook.expected("classes", 0.0, at(2026, 11, 11, 9, 30))
    assert off is not None and (off.multiple, off.reason) == (1.0, "calendar:armistice")
    assert outlook_for(AheadConfig(), None) is None
    assert isinstance(outlook_for(AheadConfig(), Forecast()), Forecast)
