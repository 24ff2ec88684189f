"""The business calendar as an outlook: the ramps an operator declared, over time.

What lives here: `occurrences` (a declared event's starts and ends in Unix seconds, in the
calendar's time zone, holidays taken out), `learned_multiple` (an event's multiple from
the traffic record: demand during its past occurrences over demand in the window just
before each), `CalendarOutlook` (an `Outlook` whose reason is "calendar:<event name>") and
`CalendarFirst` (the calendar over another outlook: a declared event wins, a holiday
suppresses what the other would expect). No I/O: the caller reads the record and passes
its entries (`learn_multiples`: every `learn: true` event's, called by forecast.refit in
the sidecar's refit); times are the caller's clock, mapped to the calendar's by an origin
and a time scale (the simulator plays a day in minutes).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from forecast.demand import RecordedRequest, request_tokens
from forecast.outlook import Expected, Outlook
from policy._ahead import AheadConfig, CalendarEvent, Holiday

DAY_S = 86_400.0


def occurrences(
    event: CalendarEvent,
    zone: dt.tzinfo,
    from_s: float,
    to_s: float,
    holidays: Iterable[Holiday] = (),
) -> list[tuple[float, float]]:
    """The event's (start, end) in Unix seconds that overlap [from_s, to_s), by start.
    A recurring event's start is its local time on each of its weekdays (a DST change moves
    it in UTC, not on the wall); a holiday that suppresses it takes that day out."""
    length_s = event.duration_min * 60.0
    if event.on is not None:
        start = event.on.replace(tzinfo=zone).timestamp()
        return [(start, start + length_s)] if start < to_s and start + length_s > from_s else []
    assert event.at is not None
    off = {
        day for h in holidays if not h.suppresses or event.name in h.suppresses for day in h.dates
    }
    found = []
    # Local days from the one whose occurrence could still be running at from_s.
    day = dt.datetime.fromtimestamp(from_s - length_s, zone).date() - dt.timedelta(days=1)
    last = dt.datetime.fromtimestamp(to_s, zone).date()
    while day <= last:
        if day.weekday() in event.days and day not in off:
            start = dt.datetime.combine(day, event.at, zone).timestamp()
            if start < to_s and start + length_s > from_s:
                found.append((start, start + length_s))
        day += dt.timedelta(days=1)
    return found


def holiday_on(holidays: Iterable[Holiday], zone: dt.tzinfo, at_s: float) -> Holiday | None:
    local = dt.datetime.fromtimestamp(at_s, zone).date()
    return next((h for h in holidays if local in h.dates), None)


def learned_multiple(
    spans: Iterable[tuple[float, float]],
    tenants: Iterable[str],
    entries: Iterable[RecordedRequest],
) -> float | None:
    """Demand during the past occurrences / demand in an equally long window just before
    each, over the event's tenants, in tokens (forecast.demand.request_tokens, unweighted:
    refused requests count, they are demand too). None: no occurrence has a window before
    it with demand in it (nothing to learn from)."""
    spans = list(spans)
    names = set(tenants)
    during = before = 0.0
    for entry in entries:
        if entry.tenant not in names:
            continue
        for start, end in spans:
            if start <= entry.t < end:
                during += request_tokens(entry, 1.0)
            elif start - (end - start) <= entry.t < start:
                before += request_tokens(entry, 1.0)
    if before <= 0.0:
        return None
    return during / before


def learn_multiples(
    config: AheadConfig,
    entries: Iterable[RecordedRequest],
    from_s: float,
    to_s: float,
) -> dict[str, float]:
    """Every `learn: true` event's multiple from its occurrences the record [from_s, to_s)
    (Unix seconds) holds whole, with the window before each: one cut by either end would
    read as a ramp too small or too large. An event with nothing to learn from is left out."""
    zone = zoneinfo.ZoneInfo(config.timezone)
    kept = list(entries)
    learned = {}
    for event in config.events:
        if not event.learn:
            continue
        spans = [
            (start, end)
            for start, end in occurrences(event, zone, from_s, to_s, config.holidays)
            if start - (end - start) >= from_s and end <= to_s
        ]
        multiple = learned_multiple(spans, event.tenants, kept)
        if multiple is not None:
            learned[event.name] = multiple
    return learned


@dataclass(frozen=True, slots=True)
class CalendarClock:
    """The caller's clock on the calendar's: Unix s = origin_s + caller s x time_scale (the
    sidecar: time.time(), origin 0, scale 1; the simulator: its virtual 0 is origin_s)."""

    origin_s: float = 0.0
    time_scale: float = 1.0

    def unix(self, caller_s: float) -> float:
        return self.origin_s + caller_s * self.time_scale


class CalendarOutlook:
    """An `Outlook` from the declared events: an event's tenants are expected at its multiple
    (of their demand outside it) while it runs; nothing is known otherwise (None). An event
    with `learn: true` counts once `learned` has its multiple."""

    def __init__(
        self,
        config: AheadConfig,
        clock: CalendarClock | None = None,
        learned: Mapping[str, float] | None = None,
    ) -> None:
        self.config = config
        self.zone = zoneinfo.ZoneInfo(config.timezone)
        self.clock = clock or CalendarClock()
        self.learned = dict(learned or {})

    def multiple(self, event: CalendarEvent) -> float | None:
        return event.multiple if event.multiple is not None else self.learned.get(event.name)

    def event_at(self, tenant: str, at_s: float) -> CalendarEvent | None:
        """The declared event of `tenant` running at the caller's `at_s` (the largest
        multiple where two overlap)."""
        unix_s = self.clock.unix(at_s)
        running = [
            e
            for e in self.config.events
            if tenant in e.tenants
            and self.multiple(e) is not None
            and occurrences(e, self.zone, unix_s, unix_s + 1e-6, self.config.holidays)
        ]
        return max(running, key=lambda e: self.multiple(e) or 0.0, default=None)

    def holiday(self, tenant: str, at_s: float) -> Holiday | None:
        """A holiday that cancels `tenant`'s expected ramps at `at_s`: one that suppresses
        every recurring event, or one of this tenant's."""
        found = holiday_on(self.config.holidays, self.zone, self.clock.unix(at_s))
        if found is None:
            return None
        if not found.suppresses:
            return found
        mine = {e.name for e in self.config.events if tenant in e.tenants}
        return found if mine & set(found.suppresses) else None

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        event = self.event_at(tenant, at_s)
        if event is None:
            return None
        multiple = self.multiple(event)
        assert multiple is not None
        return Expected(tenant, at_s, multiple, None, f"calendar:{event.name}")


class CalendarFirst:
    """The calendar over another outlook (the seasonal forecast): a declared event wins
    while it is declared; on a holiday the other's expectation of a ramp is suppressed
    (multiple 1: nothing rises), since its fit learned the working days."""

    def __init__(self, calendar: CalendarOutlook, other: Outlook | None) -> None:
        self.calendar = calendar
        self.other = other

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        declared = self.calendar.expected(tenant, now_s, at_s)
        if declared is not None or self.calendar.event_at(tenant, at_s) is not None:
            return declared
        holiday = self.calendar.holiday(tenant, at_s)
        if holiday is not None:
            return Expected(tenant, at_s, 1.0, None, f"calendar:{holiday.name}")
        return None if self.other is None else self.other.expected(tenant, now_s, at_s)


def outlook_for(
    config: AheadConfig,
    forecast: Outlook | None,
    clock: CalendarClock | None = None,
    learned: Mapping[str, float] | None = None,
) -> Outlook | None:
    """What the controller looks ahead with: the calendar over the forecast when the policy
    declares events or holidays, else the forecast alone (None: neither; it only reacts)."""
    if not config.events and not config.holidays:
        return forecast
    return CalendarFirst(CalendarOutlook(config, clock, learned), forecast)
