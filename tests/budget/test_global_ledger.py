"""ONE suite, every global ledger (tests/support/global_ledger_suite.py), run here on the
in-process one. On a real Redis (the Lua), and both side by side on random reports:
tests/e2e/budget/test_global_ledger.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from budget.global_ledger import GlobalLedger
from tests.support.clock import VirtualClock
from tests.support.global_ledger_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.global_ledger_suite import open_ledger


@pytest.fixture(params=["memory"])
async def ledger(
    request: pytest.FixtureRequest, clock: VirtualClock
) -> AsyncIterator[GlobalLedger]:
    made = open_ledger(request, request.param, clock)
    yield made
    await made.close()
