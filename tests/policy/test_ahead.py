"""The `ahead:` section: the lead, the business calendar's events and holidays, read strictly;
each bad entry names its path."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from policy._reader import PolicyError
from policy.loader import parse_policy
from policy.schema import Policy


def policy_with(ahead: Any, **sections: Any) -> Policy:
    return parse_policy({"keys": [], "ahead": ahead, **sections})


# A learned multiple is learned by the forecast's refit from the traffic record.
LEARNING = {
    "traffic_record": {"dir": "record", "keep_days": 21},
    "forecast": {"enabled": True},
}


def test_the_calendar_is_read_in_its_time_zone() -> None:
    ahead = policy_with(
        {
            "lead_min": 10,
            "timezone": "Europe/Paris",
            "calendar": [
                {
                    "name": "class",
                    "tenants": ["classes"],
                    "days": "weekdays",
                    "at": "09:00",
                    "duration_min": 60,
                    "multiple": 8,
                },
                {
                    "name": "launch",
                    "tenants": ["product"],
                    "on": "2026-12-10T14:00",
                    "duration_min": 120,
                    "multiple": 3,
                },
                {
                    "name": "christmas",
                    "dates": ["2026-12-24", "2026-12-25"],
                    "suppresses": ["class"],
                },
            ],
        },
        **LEARNING,
    ).ahead
    assert ahead is not None and ahead.lead_min == 10 and ahead.timezone == "Europe/Paris"
    recurring, one_off = ahead.events
    assert (recurring.at, recurring.days, recurring.multiple) == (
        dt.time(9, 0),
        frozenset(range(5)),
        8.0,
    )
    assert one_off.on == dt.datetime(2026, 12, 10, 14, 0) and one_off.multiple == 3.0
    assert ahead.holidays[0].dates == {dt.date(2026, 12, 24), dt.date(2026, 12, 25)}
    assert parse_policy({"keys": []}).ahead is None  # absent: the controller only reacts


@pytest.mark.parametrize(
    ("ahead", "message"),
    [
        ({"lead_min": 0}, "ahead.lead_min: must be > 0"),
        ({"timezone": "Mars/Olympus"}, "ahead.timezone: unknown time zone"),
        ({"leed_min": 5}, "ahead.leed_min: unknown field"),
        ({"squeeze": 1.5}, "ahead.squeeze: must be in (0, 1]"),
        ({"lend": 0.5}, "ahead.lend: must be >= 1"),
        ({"expect": 1.0}, "ahead.expect: must be > 1"),
        ({"calendar": {"name": "x"}}, "ahead.calendar: expected a list"),
        (
            {"calendar": [{"name": "x", "tenants": ["a"], "duration_min": 5, "multiple": 2}]},
            "ahead.calendar[0]: give exactly one of at (recurring), on (one-off) or dates",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "at": "09:00",
                        "on": "2026-01-01T09:00",
                        "duration_min": 5,
                        "multiple": 2,
                    }
                ]
            },
            "give exactly one of at",
        ),
        (
            {
                "calendar": [
                    {"name": "x", "tenants": ["a"], "at": "9h", "duration_min": 5, "multiple": 2}
                ]
            },
            "ahead.calendar[0].at: expected a local time HH:MM",
        ),
        (
            {
                "calendar": [
                    {"name": "x", "tenants": ["a"], "at": 540, "duration_min": 5, "multiple": 2}
                ]
            },
            "ahead.calendar[0].at: quote the time",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "at": "09:00",
                        "days": ["funday"],
                        "duration_min": 5,
                        "multiple": 2,
                    }
                ]
            },
            "ahead.calendar[0].days[0]: expected one of mon",
        ),
        (
            {"calendar": [{"name": "x", "tenants": ["a"], "at": "09:00", "duration_min": 5}]},
            "ahead.calendar[0].multiple: give exactly one of multiple or learn: true",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "at": "09:00",
                        "duration_min": 5,
                        "multiple": 2,
                        "learn": True,
                    }
                ]
            },
            "give exactly one of multiple or learn",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "at": "09:00",
                        "duration_min": 5,
                        "multiple": 0.5,
                    }
                ]
            },
            "ahead.calendar[0].multiple: must be > 1",
        ),
        (
            {"calendar": [{"name": "x", "at": "09:00", "duration_min": 5, "multiple": 2}]},
            "ahead.calendar[0].tenants: an event needs the tenants that ramp",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "on": "2026-01-01T09:00+01:00",
                        "duration_min": 5,
                        "multiple": 2,
                    }
                ]
            },
            "ahead.calendar[0].on: give the calendar's local time, without an offset",
        ),
        (
            {"calendar": [{"name": "x", "dates": ["2026-13-01"]}]},
            "ahead.calendar[0].dates[0]: expected a date YYYY-MM-DD",
        ),
        (
            {"calendar": [{"name": "x", "dates": ["2026-12-24"], "suppresses": ["nope"]}]},
            "suppresses: no event named 'nope'",
        ),
        (
            {
                "calendar": [
                    {"name": "x", "dates": ["2026-12-24"]},
                    {"name": "x", "dates": ["2026-12-25"]},
                ]
            },
            "ahead.calendar[1].name: used twice",
        ),
        (
            {
                "calendar": [
                    {
                        "name": "x",
                        "tenants": ["a"],
                        "at": "09:00",
                        "duration_min": 5,
                        "multiple": 2,
                        "colour": "red",
                    }
                ]
            },
            "ahead.calendar[0].colour: unknown field",
        ),
    ],
)
def test_a_bad_entry_names_its_path(ahead: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        policy_with(ahead)


def test_a_learned_event_without_the_forecast_is_refused_naming_the_fix() -> None:
    launch = {"name": "launch", "tenants": ["p"], "at": "14:00", "duration_min": 60}
    learning = {"calendar": [{**launch, "learn": True}]}
    with pytest.raises(PolicyError, match=re.escape("ahead.calendar[launch].learn:")) as refused:
        policy_with(learning)
    assert "forecast.enabled: true" in str(refused.value) and "multiple" in str(refused.value)
    assert policy_with(learning, **LEARNING).ahead is not None
    assert policy_with({"calendar": [{**launch, "multiple": 3}]}).ahead is not None


def test_a_one_off_event_cannot_learn_its_multiple() -> None:
    """A one-off has no past occurrence: learning would leave it never raising, silently."""
    once = {"name": "launch", "tenants": ["p"], "on": "2026-12-10T14:00", "duration_min": 60}
    with pytest.raises(PolicyError, match="has no past occurrences to learn from") as refused:
        policy_with({"calendar": [{**once, "learn": True}]}, **LEARNING)
    assert "ahead.calendar[0].learn" in str(refused.value), refused.value
    assert policy_with({"calendar": [{**once, "multiple": 3}]}).ahead is not None
