"""Spend budgets per tenant: the arithmetic (prices per token kind, cached and reasoning
tokens, UTC calendar windows) and ONE suite run on the in-process store and on real Redis
(single and cluster), including two replicas charging one tenant through one Redis."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator

import pytest

from budget.redis_store import connect
from budget.spend import SpendHold, SpendWindow, TokenUsage, reserved_cost, window, windows
from budget.spend_redis import RedisSpendStore
from budget.spend_store import InProcessSpendStore, SpendStore
from tests.support.clock import VirtualClock

PRICES = {"prompt": 1.0, "cached_prompt": 0.1, "completion": 4.0, "reasoning": 6.0}
STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.e2e),
    pytest.param("cluster", marks=pytest.mark.e2e),
]
# 2026-12-31 23:00 UTC: an hour before the day and the month (and the year) roll over.
NEW_YEARS_EVE_S = dt.datetime(2026, 12, 31, 23, 0, tzinfo=dt.UTC).timestamp()


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


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(NEW_YEARS_EVE_S)


def _store(request: pytest.FixtureRequest, kind: str, clock: VirtualClock) -> SpendStore:
    if kind == "memory":
        return InProcessSpendStore(clock)
    if kind == "redis":
        port = request.getfixturevalue("redis_port")
        return RedisSpendStore(connect(f"redis://127.0.0.1:{port}"), clock)
    ports = request.getfixturevalue("cluster_ports")
    return RedisSpendStore(connect(f"redis://127.0.0.1:{ports[0]}", cluster=True), clock)


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[SpendStore]:
    yield _store(request, request.param, clock)


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def hold(who: str, spans: tuple[SpendWindow, ...], amount: float) -> SpendHold:
    return SpendHold(who, spans, PRICES, amount)


def rid() -> str:
    return uuid.uuid4().hex


async def test_admits_while_under_then_refuses_naming_the_window(
    store: SpendStore, clock: VirtualClock
) -> None:
    who, spans = tenant(), windows({"day": 1000.0, "month": 5000.0}, clock())
    ids = [s.id for s in spans]
    first = await store.reserve(hold(who, spans, 900), "a", 600)
    assert first.admitted and first.used == {ids[0]: 900, ids[1]: 900}
    assert await store.settle(who, ids, "a", 700) == {ids[0]: 700, ids[1]: 700}
    # 700 < 1000: admitted although it may cost more than is left (it is not cut)...
    second = await store.reserve(hold(who, spans, 900), "b", 600)
    assert second.admitted and second.used[ids[0]] == 1600
    assert await store.settle(who, ids, "b", 450) == {ids[0]: 1150, ids[1]: 1150}
    # ... and the next is refused by the day, until it ends.
    refused = await store.reserve(hold(who, spans, 1), "c", 600)
    assert not refused.admitted and refused.refused is not None
    assert refused.refused.name == "day" and refused.used[ids[0]] == 1150
    assert await store.used(who, ids) == {ids[0]: 1150, ids[1]: 1150}


async def test_refund_and_unknown_reservation(store: SpendStore, clock: VirtualClock) -> None:
    who, spans = tenant(), windows({"month": 100.0}, clock())
    ids = [s.id for s in spans]
    assert (await store.reserve(hold(who, spans, 99.5), "a", 600)).admitted
    assert await store.settle(who, ids, "a", None) == {ids[0]: 0}
    assert await store.settle(who, ids, "a", 10) is None  # settled once only
    assert await store.used(who, ids) == {ids[0]: 0}


async def test_a_held_reservation_counts_until_it_settles(
    store: SpendStore, clock: VirtualClock
) -> None:
    who, spans = tenant(), windows({"month": 100.0}, clock())
    assert (await store.reserve(hold(who, spans, 100), "a", 600)).admitted
    assert not (await store.reserve(hold(who, spans, 1), "b", 600)).admitted
    # Never settled: after its ttl the charge stays spent (the work may have been done).
    clock.advance(601)
    assert not (await store.reserve(hold(who, spans, 1), "c", 600)).admitted
    assert await store.settle(who, [spans[0].id], "a", 5) is None


async def test_the_day_rolls_over_at_midnight_utc_the_month_keeps_counting(
    store: SpendStore, clock: VirtualClock
) -> None:
    who, limits = tenant(), {"day": 100.0, "month": 150.0}
    spans = windows(limits, clock())
    assert (await store.reserve(hold(who, spans, 100), "a", 600)).admitted
    await store.settle(who, [s.id for s in spans], "a", 100)
    assert not (await store.reserve(hold(who, windows(limits, clock()), 1), "b", 600)).admitted
    clock.advance(3600)  # 2027-01-01 00:00: a new day AND a new month
    fresh = windows(limits, clock())
    assert (await store.reserve(hold(who, fresh, 120), "c", 600)).admitted
    await store.settle(who, [s.id for s in fresh], "c", 120)
    clock.advance(86400)  # the next day: the day reopens, the month (120 of 150) not yet full
    assert (await store.reserve(hold(who, windows(limits, clock()), 1), "d", 600)).admitted
    # A reservation made before midnight settles in the windows it was made in.
    assert await store.settle(who, [s.id for s in spans], "d", 1) is None


async def test_two_replicas_never_pass_the_limit_by_more_than_one_reservation(
    request: pytest.FixtureRequest, clock: VirtualClock
) -> None:
    """Two sidecars sharing one Redis charge one tenant concurrently: what is admitted
    stops once the month is full, overshooting it by less than one request's reservation."""
    if "redis_port" not in request.fixturenames:
        request.getfixturevalue("redis_port")
    replicas = [_store(request, "redis", clock) for _ in range(2)]
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


test_two_replicas_never_pass_the_limit_by_more_than_one_reservation = pytest.mark.e2e(
    test_two_replicas_never_pass_the_limit_by_more_than_one_reservation
)
