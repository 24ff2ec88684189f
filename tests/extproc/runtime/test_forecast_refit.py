"""The forecasts' refit inside a sidecar: in a process of its own, its result on the loop;
the business calendar's `learn: true` events learned by the same refit.

A sidecar in this process (tests.support.in_process) on a policy that enables the forecast,
over a synthetic record of the last nine days (sim.fleet.synthetic_weeks, hourly bins: the
fits take milliseconds); no Envoy is needed, nothing is sent through it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import time
import zoneinfo
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from extproc.runtime.forecast_refit import RefitFailed, refit_elsewhere
from extproc.service.traffic_read import TrafficEntry
from forecast.calendar import occurrences
from forecast.refit import RefitSettings
from forecast.seasonal import DAY_S
from policy._ahead import CalendarEvent
from sim.fleet.synthetic_weeks import (
    WEEKLY_TENANTS,
    expected_multiple,
    synthetic_weeks,
    write_record,
)
from tests.support.in_process import in_process
from tests.support.stack import example_policy, write_policy


def forecasting_policy(tmp_path: Path, entries: list[TrafficEntry]) -> dict[str, Any]:
    """The example policy refitting hourly from nine days of `entries` (those already past,
    written as the traffic record), with no pools scraped (none run here)."""
    write_record([e for e in entries if e.t < time.time()], tmp_path / "record")
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False
    policy["traffic_record"] = {"dir": "record", "keep_days": 9}
    policy["forecast"] = {
        "enabled": True,
        "history_days": 9,
        "held_back_days": 1,
        "bin_s": 3600,
        "refit_interval_s": 3600,
    }
    return policy


async def test_the_refit_runs_in_its_own_process_and_its_error_is_exported(
    tmp_path: Path,
) -> None:
    today_s = math.floor(time.time() / DAY_S) * DAY_S
    shapes = [s for s in WEEKLY_TENANTS if s.tenant in ("school", "steady")]
    start_s = today_s - 9 * DAY_S
    entries = synthetic_weeks(seed=2, days=10, start_s=start_s, tenants=shapes, scale=0.2)
    policy = forecasting_policy(tmp_path, entries)
    path = tmp_path / "policy.yaml"
    write_policy(path, policy)
    async with in_process(path, exact_tokenizer=False) as (sidecar, _driver, _address):
        refitter = sidecar.control.forecast
        # Until the first refit ends, either way (a loaded machine spawns slowly).
        await asyncio.wait_for(refitter.tried.wait(), 120)
        assert refitter.failures == 0 and refitter.refits == 1
        assert refitter.last_pid not in (None, 0, os.getpid())
        done = sidecar.signals.outlook.last
        assert done is not None and set(done.forecasts) == {"school", "steady"}
        # The controller's outlook answers from it.
        now_s = time.time()
        expected = sidecar.signals.outlook.expected("steady", now_s, now_s + 3600)
        assert expected is not None and expected.reason == "forecast"
        exposition = generate_latest(sidecar.metrics.registry).decode()
        assert 'slogate_forecast_error_ratio{tenant="steady"}' in exposition
        assert 'slogate_forecast_refits_total{result="ok"} 1.0' in exposition
        assert 'kind="seasonal",tenant="school"' in exposition or (
            'tenant="school",kind="seasonal"' in exposition
        )
        error = done.forecasts["steady"].error
        assert error is not None and error < 0.5


async def test_a_learn_true_event_gets_its_multiple_from_the_recorded_history(
    tmp_path: Path,
) -> None:
    today_s = math.floor(time.time() / DAY_S) * DAY_S
    school = [s for s in WEEKLY_TENANTS if s.tenant == "school"]  # 8x from 09:00 UTC
    start_s = today_s - 9 * DAY_S
    entries = synthetic_weeks(seed=4, days=10, start_s=start_s, tenants=school, holiday_days=())
    policy = forecasting_policy(tmp_path, entries)
    event = {"name": "class", "tenants": ["school"], "days": "weekdays", "at": "09:00"}
    policy["ahead"] = {
        "timezone": "UTC",
        "calendar": [{**event, "duration_min": 60, "learn": True}],
    }
    path = tmp_path / "policy.yaml"
    write_policy(path, policy)
    async with in_process(path, exact_tokenizer=False) as (sidecar, _driver, _address):
        await asyncio.wait_for(sidecar.control.forecast.tried.wait(), 120)
        done = sidecar.signals.outlook.last
        assert done is not None
        # The generator's truth over the occurrences the refit's window held whole, with
        # the hour before each.
        declared = CalendarEvent("class", ("school",), 60.0, None, dt.time(9), frozenset(range(5)))
        spans = [
            (begin, end)
            for begin, end in occurrences(declared, zoneinfo.ZoneInfo("UTC"), 0.0, done.end_s)
            if begin - 3600 >= done.start_s
        ]
        assert len(spans) >= 5  # nine days hold five weekdays at least
        truth = expected_multiple(school[0], spans, days=10, start_s=start_s, holiday_days=())
        learned = sidecar.signals.ahead.learned
        assert set(learned) == {"class"} and learned["class"] == pytest.approx(truth, rel=0.15)
        exposition = generate_latest(sidecar.metrics.registry).decode()
        assert f'slogate_calendar_learned_multiple{{event="class"}} {learned["class"]}' in (
            exposition
        )
        # The planner's calendar now expects the class at that multiple (it raised nothing
        # before: an unlearned event counts for nothing).
        planner = sidecar.signals.ahead.current(sidecar.policy().ahead)
        assert planner is not None and planner.outlook is not None
        next_class = spans[-1][0] + 7 * DAY_S + 1800  # a week on: a weekday's class
        expected = planner.outlook.expected("school", next_class - 3600, next_class)
        assert expected is not None and expected.reason == "calendar:class"
        assert expected.multiple == learned["class"]


async def test_a_refit_that_fails_in_its_process_says_why(tmp_path: Path) -> None:
    # A bin of 0 s: the child divides by it; the sidecar gets its traceback.
    settings = RefitSettings(history_days=2, bin_s=0.0, held_back_days=1)
    with pytest.raises(RefitFailed, match="ZeroDivisionError"):
        await refit_elsewhere(tmp_path, settings, {}, time.time())
