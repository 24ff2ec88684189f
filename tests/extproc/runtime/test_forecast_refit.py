"""The forecasts' refit inside a sidecar: in a process of its own, its result on the loop.

A sidecar in this process (tests.support.in_process) on a policy that enables the forecast,
over a synthetic record of the last nine days (sim.fleet.synthetic_weeks, hourly bins: the
fits take milliseconds); no Envoy is needed, nothing is sent through it.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from extproc.runtime.forecast_refit import RefitFailed, refit_elsewhere
from forecast.refit import RefitSettings
from forecast.seasonal import DAY_S
from sim.fleet.synthetic_weeks import WEEKLY_TENANTS, synthetic_weeks, write_record
from tests.support.in_process import in_process
from tests.support.stack import example_policy, write_policy


async def test_the_refit_runs_in_its_own_process_and_its_error_is_exported(
    tmp_path: Path,
) -> None:
    today_s = math.floor(time.time() / DAY_S) * DAY_S
    shapes = [s for s in WEEKLY_TENANTS if s.tenant in ("school", "steady")]
    start_s = today_s - 9 * DAY_S
    entries = synthetic_weeks(seed=2, days=10, start_s=start_s, tenants=shapes, scale=0.2)
    write_record([e for e in entries if e.t < time.time()], tmp_path / "record")
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False  # no pools run here
    policy["traffic_record"] = {"dir": "record", "keep_days": 9}
    policy["forecast"] = {
        "enabled": True,
        "history_days": 9,
        "held_back_days": 1,
        "bin_s": 3600,
        "refit_interval_s": 3600,
    }
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


async def test_a_refit_that_fails_in_its_process_says_why(tmp_path: Path) -> None:
    # A bin of 0 s: the child divides by it; the sidecar gets its traceback.
    settings = RefitSettings(history_days=2, bin_s=0.0, held_back_days=1)
    with pytest.raises(RefitFailed, match="ZeroDivisionError"):
        await refit_elsewhere(tmp_path, settings, {}, time.time())
