"""ONE suite, every spend store: in-process, Redis (a real server) and a 3-node Redis Cluster,
at UTC calendar windows' edges (a virtual clock an hour before the new year).

The tests below are collected where they are imported with `*`, each module defining the
`store` fixture over its kinds with `open_store`: tests/budget/test_spend.py in process,
tests/e2e/budget/test_spend.py on the real servers.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from budget.redis_store import connect
from budget.spend import SpendHold, SpendWindow, windows
from budget.spend_redis import RedisSpendStore
from budget.spend_store import InProcessSpendStore, SpendStore
from tests.support.clock import VirtualClock

# What a tenant's tokens cost (the suites' reservations carry them).
PRICES = {"prompt": 1.0, "cached_prompt": 0.1, "completion": 4.0, "reasoning": 6.0}


def hold(who: str, spans: tuple[SpendWindow, ...], amount: float) -> SpendHold:
    return SpendHold(who, spans, PRICES, amount)


__all__ = [
    "clock",
    "test_a_held_reservation_counts_until_it_settles",
    "test_a_request_refused_unverified_leaves_nothing_held_when_its_reservation_lands_late",
    "test_a_request_settled_unverified_counts_once_whether_its_reservation_landed_or_not",
    "test_admits_while_under_then_refuses_naming_the_window",
    "test_refund_and_unknown_reservation",
    "test_the_day_rolls_over_at_midnight_utc_the_month_keeps_counting",
]
# 2026-12-31 23:00 UTC: an hour before the day and the month (and the year) roll over.
NEW_YEARS_EVE_S = dt.datetime(2026, 12, 31, 23, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(NEW_YEARS_EVE_S)


def open_store(request: pytest.FixtureRequest, kind: str, clock: VirtualClock) -> SpendStore:
    """A spend store of `kind`: memory, redis or cluster."""
    if kind == "memory":
        return InProcessSpendStore(clock)
    if kind == "redis":
        port = request.getfixturevalue("redis_port")
        return RedisSpendStore(connect(f"redis://127.0.0.1:{port}"), clock)
    ports = request.getfixturevalue("cluster_ports")
    return RedisSpendStore(connect(f"redis://127.0.0.1:{ports[0]}", cluster=True), clock)


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


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


async def test_a_request_settled_unverified_counts_once_whether_its_reservation_landed_or_not(
    store: SpendStore, clock: VirtualClock
) -> None:
    """A request admitted while its check went unanswered is settled unverified: what it
    spent counts once, whether its reservation landed before (replaced), never (charged
    outright) or lands after (it holds nothing), however often the settlement is retried."""
    who, spans = tenant(), windows({"day": 1000.0, "month": 5000.0}, clock())
    ids = [s.id for s in spans]
    # Landed before: the reservation of 900 is replaced by the 300 spent.
    assert (await store.reserve(hold(who, spans, 900), "landed", 600)).admitted
    assert await store.settle_unverified(hold(who, spans, 900), "landed", 300, 600) == {
        ids[0]: 300,
        ids[1]: 300,
    }
    # Never landed: the 200 spent is charged outright; retried, nothing changes.
    assert await store.settle_unverified(hold(who, spans, 900), "lost", 200, 600) == {
        ids[0]: 500,
        ids[1]: 500,
    }
    assert await store.settle_unverified(hold(who, spans, 900), "lost", 200, 600) is None
    # Landing after its settlement: it holds nothing, and settling it again changes nothing.
    late = await store.reserve(hold(who, spans, 900), "lost", 600)
    assert not late.admitted and late.refused is None
    assert await store.settle(who, ids, "lost", 200) is None
    assert await store.used(who, ids) == {ids[0]: 500, ids[1]: 500}
    # The markers leave with their ttl; what was spent stays.
    clock.advance(601)
    assert await store.used(who, ids) == {ids[0]: 500, ids[1]: 500}


async def test_a_request_refused_unverified_leaves_nothing_held_when_its_reservation_lands_late(
    store: SpendStore, clock: VirtualClock
) -> None:
    who, spans = tenant(), windows({"month": 100.0}, clock())
    ids = [s.id for s in spans]
    assert await store.settle_unverified(hold(who, spans, 60), "refused", None, 600) == {ids[0]: 0}
    assert not (await store.reserve(hold(who, spans, 60), "refused", 600)).admitted
    # Refunded whichever came first: the month is whole for the next request.
    assert (await store.reserve(hold(who, spans, 60), "next", 600)).admitted
    assert (await store.reserve(hold(who, spans, 30), "early", 600)).admitted
    assert await store.settle_unverified(hold(who, spans, 30), "early", None, 600) == {ids[0]: 60}
    assert await store.used(who, ids) == {ids[0]: 60}
