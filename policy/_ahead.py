"""The `ahead:` section: quotas moved before a ramp, and the business calendar that declares them.

What lives here: `AheadConfig` (the lead, the grace a raise waits for its ramp, how far
sheddable work is squeezed and what it may borrow at night), `CalendarEvent` (a recurring
or one-off event: tenants, duration, the expected multiple or `learn`), `Holiday` (dates
that suppress the recurring events) and their strict reader. What the events mean over
time is forecast.calendar's; what the controller does with them is budget.ahead's.

```yaml
ahead:
  lead_min: 10              # raise this long before a declared or forecast ramp
  grace_min: 15             # ... and give back if demand has not risen by lead + grace
  timezone: Europe/Paris    # the calendar's wall clock (zoneinfo)
  calendar:
    - {name: morning-class, tenants: [classes], days: weekdays, at: "09:00",
       duration_min: 60, multiple: 8}
    - {name: launch, tenants: [product], on: "2026-12-10T14:00", duration_min: 120, multiple: 4}
    - {name: christmas, dates: ["2026-12-24", "2026-12-25"]}   # a holiday
```
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

from policy._reader import PolicyError, Section, expect, kind_of, positive

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_SETS = {"daily": frozenset(range(7)), "weekdays": frozenset(range(5))}


@dataclass(frozen=True, slots=True)
class CalendarEvent:
    """A ramp the operator declares: recurring (`at` on `days`) or one-off (`on`)."""

    name: str
    tenants: tuple[str, ...]
    duration_min: float
    multiple: float | None  # expected demand during it / before it; None: learned
    at: dt.time | None = None  # recurring: the local start time ...
    days: frozenset[int] = frozenset()  # ... on these weekdays (0: Monday)
    on: dt.datetime | None = None  # one-off: the local start (naive: the calendar's zone)

    @property
    def learn(self) -> bool:
        return self.multiple is None


@dataclass(frozen=True, slots=True)
class Holiday:
    """Local dates on which recurring events do not happen (and no ramp is expected)."""

    name: str
    dates: frozenset[dt.date]
    suppresses: tuple[str, ...] = ()  # the events it cancels; empty: every recurring one


@dataclass(frozen=True, slots=True)
class AheadConfig:
    lead_min: float = 10.0  # how long before a ramp the budgets move
    grace_min: float = 15.0  # a raise whose ramp has not come by lead + grace is given back
    expect: float = 2.0  # an outlook's multiple at least this within the lead: a ramp
    rise: float = 1.5  # measured demand this many times its level at the raise: it came
    # The sheddable tier's multiplier cap while a raise holds, and its KV share cap (the
    # headroom kept for the ramp). Measured (bench/results/ahead-*.md): 0.1 and 0.5 won the
    # same burst handling on a 10 s class start as 0.5 and 0.7, and cost 12% goodput
    # instead of 4% on a 5-minute ramp the reaction handled alone.
    squeeze: float = 0.5
    reserve_kv_share: float = 0.7
    # Idle hours (every non-sheddable tenant forecast flat or falling, the fleet quiet):
    # the sheddable tier's multiplier may reach this (1.0: nothing lent).
    lend: float = 1.0
    timezone: str = "UTC"
    events: tuple[CalendarEvent, ...] = ()
    holidays: tuple[Holiday, ...] = ()


def parse_ahead(raw: object, path: str) -> AheadConfig | None:
    """None: the section is absent; the controller only reacts."""
    if raw is None:
        return None
    sec = Section(raw, path)
    config = sec.config(AheadConfig, events=(), holidays=())
    for name in ("lead_min", "grace_min", "squeeze", "reserve_kv_share", "lend"):
        positive(getattr(config, name), sec.child(name))
    for name in ("expect", "rise"):
        if getattr(config, name) <= 1.0:
            raise PolicyError(f"{sec.child(name)}: must be > 1, got {getattr(config, name)}")
    for name in ("squeeze", "reserve_kv_share"):
        if getattr(config, name) > 1.0:
            raise PolicyError(f"{sec.child(name)}: must be in (0, 1], got {getattr(config, name)}")
    if config.lend < 1.0:
        raise PolicyError(f"{sec.child('lend')}: must be >= 1 (1: nothing lent), got {config.lend}")
    try:
        zoneinfo.ZoneInfo(config.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise PolicyError(
            f"{sec.child('timezone')}: unknown time zone {config.timezone!r}"
        ) from None
    events, holidays = _calendar(sec.raw("calendar"), sec.child("calendar"))
    sec.close()
    known = {e.name for e in events}
    for holiday in holidays:
        for event in holiday.suppresses:
            if event not in known:
                raise PolicyError(
                    f"{sec.child('calendar')}[{holiday.name}].suppresses: no event named {event!r}"
                )
    return AheadConfig(
        config.lead_min,
        config.grace_min,
        config.expect,
        config.rise,
        config.squeeze,
        config.reserve_kv_share,
        config.lend,
        config.timezone,
        tuple(events),
        tuple(holidays),
    )


def _calendar(raw: object, path: str) -> tuple[list[CalendarEvent], list[Holiday]]:
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected a list, got {kind_of(raw)}")
    events: list[CalendarEvent] = []
    holidays: list[Holiday] = []
    names: set[str] = set()
    for index, item in enumerate(raw):
        sec = Section(item, f"{path}[{index}]")
        name = sec.require("name", str)
        if not name or name in names:
            raise PolicyError(f"{sec.child('name')}: {'empty' if not name else 'used twice'}")
        names.add(name)
        kinds = [k for k in ("at", "on", "dates") if sec.raw(k) is not None]
        if len(kinds) != 1:
            raise PolicyError(
                f"{path}[{index}]: give exactly one of at (recurring), on (one-off) or "
                f"dates (a holiday); got {', '.join(kinds) or 'none'}"
            )
        if kinds[0] == "dates":
            holidays.append(_holiday(sec, name))
        else:
            events.append(_event(sec, name, kinds[0]))
        sec.close()
    return events, holidays


def _holiday(sec: Section, name: str) -> Holiday:
    dates_raw = expect(sec.raw("dates"), list, sec.child("dates"))
    if not dates_raw:
        raise PolicyError(f"{sec.child('dates')}: names no date")
    dates = frozenset(_date(v, f"{sec.child('dates')}[{i}]") for i, v in enumerate(dates_raw))
    suppresses = _names(sec.raw("suppresses"), sec.child("suppresses"))
    return Holiday(name, dates, suppresses)


def _event(sec: Section, name: str, kind: str) -> CalendarEvent:
    tenants = _names(sec.raw("tenants"), sec.child("tenants"))
    if not tenants:
        raise PolicyError(f"{sec.child('tenants')}: an event needs the tenants that ramp")
    duration = sec.require("duration_min", float)
    positive(duration, sec.child("duration_min"))
    learn = sec.get("learn", bool, False)
    multiple_raw = sec.raw("multiple")
    if learn == (multiple_raw is not None):
        raise PolicyError(f"{sec.child('multiple')}: give exactly one of multiple or learn: true")
    multiple = None
    if multiple_raw is not None:
        multiple = expect(multiple_raw, float, sec.child("multiple"))
        if multiple <= 1.0:
            raise PolicyError(f"{sec.child('multiple')}: must be > 1 (a ramp), got {multiple}")
    if kind == "on":
        if sec.raw("days") is not None:
            raise PolicyError(f"{sec.child('days')}: a one-off event (on) has no days")
        if learn:
            # Learning reads the event's past occurrences; a one-off has none, so it would
            # never raise anything, silently.
            raise PolicyError(
                f"{sec.child('learn')}: a one-off event (on) has no past occurrences to learn "
                "from: give it a multiple"
            )
        on = _datetime(sec.raw("on"), sec.child("on"))
        return CalendarEvent(name, tenants, duration, multiple, on=on)
    at = _time(sec.raw("at"), sec.child("at"))
    days = _days(sec.raw("days"), sec.child("days"))
    return CalendarEvent(name, tenants, duration, multiple, at=at, days=days)


def _names(raw: object, path: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = expect(raw, list, path)
    return tuple(expect(v, str, f"{path}[{i}]") for i, v in enumerate(items))


def _days(raw: object, path: str) -> frozenset[int]:
    if raw is None:
        return _DAY_SETS["daily"]
    if isinstance(raw, str):
        if raw not in _DAY_SETS:
            raise PolicyError(f"{path}: expected daily, weekdays or a list of {DAY_NAMES}")
        return _DAY_SETS[raw]
    items = _names(raw, path)
    days = set()
    for i, day in enumerate(items):
        if day.lower() not in DAY_NAMES:
            raise PolicyError(f"{path}[{i}]: expected one of {', '.join(DAY_NAMES)}, got {day!r}")
        days.add(DAY_NAMES.index(day.lower()))
    if not days:
        raise PolicyError(f"{path}: names no day")
    return frozenset(days)


def _time(raw: object, path: str) -> dt.time:
    if isinstance(raw, int):  # YAML 1.1 reads an unquoted 09:00 as 540 (base 60)
        raise PolicyError(f'{path}: quote the time ("09:00"): YAML read it as a number')
    text = expect(raw, str, path)
    try:
        return dt.time.fromisoformat(text)
    except ValueError:
        raise PolicyError(f"{path}: expected a local time HH:MM, got {text!r}") from None


def _datetime(raw: object, path: str) -> dt.datetime:
    if isinstance(raw, dt.datetime):  # YAML reads an unquoted timestamp itself
        value = raw
    else:
        text = expect(raw, str, path)
        try:
            value = dt.datetime.fromisoformat(text)
        except ValueError:
            raise PolicyError(f"{path}: expected a local date and time, got {text!r}") from None
    if value.tzinfo is not None:
        raise PolicyError(f"{path}: give the calendar's local time, without an offset")
    return value


def _date(raw: object, path: str) -> dt.date:
    if isinstance(raw, dt.date) and not isinstance(raw, dt.datetime):
        return raw
    text = expect(raw, str, path)
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise PolicyError(f"{path}: expected a date YYYY-MM-DD, got {text!r}") from None
