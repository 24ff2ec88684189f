"""The live ahead arms' policies: the calendar event on the run's wall clock, the planner's
durations and the controller's interval scaled as the workload is, and the policy loads."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from policy.loader import load_policy
from sim.fleet.workload_files import SIMULATION_POLICY, workload_path, workload_policy
from tooling.loadtest.ahead_arms import ahead_document, ahead_policy

START = dt.datetime(2026, 12, 5, 16, 0, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture(scope="module")
def ramp() -> tuple[dict, dict]:
    path = workload_path("class-start-ramp")
    return yaml.safe_load(path.read_text()), workload_policy(path, SIMULATION_POLICY)


def test_calendar_event_at_the_ramps_wall_time_with_scaled_durations(ramp, tmp_path) -> None:
    document, protected = ramp
    policy = ahead_policy(protected, document, "calendar", START, 0.2)
    event = policy["ahead"]["calendar"][0]
    # The ramp starts at workload 300 s: 60 real seconds after the arrivals at scale 0.2.
    assert event["on"] == "2026-12-05T16:01:00"
    assert event["tenants"] == ["classes"]
    assert event["duration_min"] == pytest.approx(2.0)  # 600 workload s
    assert policy["ahead"]["lead_min"] == pytest.approx(0.6)
    assert policy["ahead"]["grace_min"] == pytest.approx(0.6)
    assert policy["breaker"]["controller_interval_s"] == pytest.approx(1.0)
    assert "ahead" not in protected  # the workload's own policy is left alone
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    loaded = load_policy(path)
    assert loaded.ahead is not None
    (declared,) = loaded.ahead.events
    assert declared.on == dt.datetime(2026, 12, 5, 16, 1, 0)
    assert loaded.breaker.controller_interval_s == pytest.approx(1.0)


def test_reactive_arms_declare_nothing_and_step_at_the_same_pace(ramp) -> None:
    document, protected = ramp
    for arm in ("reactive", "reactive-never"):
        policy = ahead_policy(protected, document, arm, START, 0.5)
        assert "ahead" not in policy
        assert policy["breaker"]["controller_interval_s"] == pytest.approx(2.5)


def test_the_wrong_calendar_keeps_the_event_and_loses_the_ramp(ramp) -> None:
    document, protected = ramp
    policy = ahead_policy(protected, document, "wrong-calendar", START, 0.2)
    assert policy["ahead"]["calendar"][0]["on"] == "2026-12-05T16:01:00"
    never = ahead_document(document, "wrong-calendar")
    (classes,) = (t for t in never["tenants"] if t["tenant"] == "classes")
    assert classes["streams"][0]["shape"] == [[0, 0.125], [900.0, 0.125]]
    assert ahead_document(document, "calendar") == document
    assert never["bursts"] == document["bursts"]
