"""Spend budgets per tenant: the arithmetic (prices per token kind, cached and reasoning
tokens, UTC calendar windows), and ONE suite (tests/support/spend_store_suite.py) run here on
the in-process store. On real Redis (single and cluster), and two replicas charging one
tenant through one Redis: tests/e2e/budget/test_spend.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest

from budget.spend import TokenUsage, reserved_cost, window, windows
from budget.spend_store import SpendStore
from tests.support.clock import VirtualClock
from tests.support.spend_store_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.spend_store_suite import NEW_YEARS_EVE_S, open_store

PRICES = {"prompt": 1.0, "cached_prompt": 0.1, "completion": 4.0, "reasoning": 6.0}


def test_cost_prices_each_token_kind() -> None:
    usage = TokenUsage(prompt=1000, completion=300, cached_prompt=600, reasoning=200)
    # 400 uncached x 1 + 600 cached x 0.1 + 100 plain completion x 4 + 200 reasoning x 6
    assert usage.cost(PRICES) == pytest.approx(400 + 60 + 400 + 1200)
    # Counts past their parent (a confused engine) never make a negative part.
    assert TokenUsage(10, 5, cached_prompt=50, reasoning=9).cost(PRICES) == pytest.approx(
        10 * 0.1 + 5 * 6.0
    )


def test_reservation_takes_the_dearer_of_completion_and_reasoning() -> None:
    assert reserved_cost(1000, 100, PRICES) == pytest.approx(1000 + 600)
    cheap_reasoning = {**PRICES, "reasoning": 1.0}
    assert reserved_cost(1000, 100, cheap_reasoning) == pytest.approx(1000 + 400)


def test_windows_are_utc_calendar_days_and_months() -> None:
    day = window("day", 10, NEW_YEARS_EVE_S)
    month = window("month", 10, NEW_YEARS_EVE_S)
    assert (day.id, month.id) == ("day:2026-12-31", "month:2026-12")
    new_year = dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()
    assert day.ends_s == month.ends_s == new_year
    after = windows({"day": 1, "month": 2}, new_year)
    assert [w.id for w in after] == ["day:2027-01-01", "month:2027-01"]
    assert window("month", 1, dt.datetime(2028, 2, 10, tzinfo=dt.UTC).timestamp()).ends_s == (
        dt.datetime(2028, 3, 1, tzinfo=dt.UTC).timestamp()  # a leap February
    )


@pytest.fixture(params=["memory"])
async def store(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[SpendStore]:
    yield open_store(request, request.param, clock)
