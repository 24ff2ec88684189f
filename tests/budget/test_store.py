"""ONE suite, every store (tests/support/budget_store_suite.py), run here on the stores in
this process: the in-process one, and the candidate policy's windows beside the real ones
(budget.prefixed_store). On Redis and a Redis Cluster: tests/e2e/budget/test_store.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from budget.store import BudgetStore
from tests.support.budget_store_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.budget_store_suite import open_store
from tests.support.clock import VirtualClock


@pytest.fixture(params=["memory", "prefixed"])
async def store(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[BudgetStore]:
    async with open_store(request, request.param, clock) as made:
        yield made
