"""ONE suite, every spend store (tests/support/spend_store_suite.py), run here on real Redis
(single and cluster); and two replicas charging one tenant through one Redis. The arithmetic
and the in-process store: tests/budget/test_spend.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from budget.spend import windows
from budget.spend_store import SpendStore
from tests.support.clock import VirtualClock
from tests.support.spend_store_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.spend_store_suite import hold, open_store, tenant


@pytest.fixture(params=["redis", "cluster"])
async def store(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[SpendStore]:
    yield open_store(request, request.param, clock)


async def test_two_replicas_never_pass_the_limit_by_more_than_one_reservation(
    request: pytest.FixtureRequest, clock: VirtualClock
) -> None:
    """Two sidecars sharing one Redis charge one tenant concurrently: what is admitted
    stops once the month is full, overshooting it by less than one request's reservation."""
    if "redis_port" not in request.fixturenames:
        request.getfixturevalue("redis_port")
    replicas = [open_store(request, "redis", clock) for _ in range(2)]
    who, spans, cost = tenant(), windows({"month": 10_000.0}, clock()), 170.0

    async def client(store: SpendStore, name: str) -> int:
        admitted = 0
        for i in range(60):
            verdict = await store.reserve(hold(who, spans, cost), f"{name}-{i}", 600)
            if verdict.admitted:
                admitted += 1
                await store.settle(who, [spans[0].id], f"{name}-{i}", cost)
        return admitted

    counts = await asyncio.gather(*(client(s, f"r{n}") for n, s in enumerate(replicas)))
    total = sum(counts) * cost
    assert all(c > 0 for c in counts)  # both replicas charged the one budget
    assert 10_000 <= total < 10_000 + cost  # 59 x 170 = 10,030: past by less than one
    assert (await replicas[1].used(who, [spans[0].id]))[spans[0].id] == pytest.approx(total)
