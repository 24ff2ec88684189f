"""ONE suite, every store: in-process, Redis (a real server) and a 3-node Redis Cluster.

A virtual clock is injected into each store, so the suite moves time without sleeping;
production Redis stores use the server's TIME instead.

The tests below are collected where they are imported with `*`, each module defining the
`store` fixture over its kinds with `open_store`: tests/budget/test_store.py on the in-process
stores, tests/e2e/budget/test_store.py on the real servers.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from budget.ledger import Charge
from budget.prefixed_store import PrefixedStore
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore, InProcessStore
from policy.domain import Limits
from tests.support.clock import VirtualClock

__all__ = [
    "clock",
    "test_a_request_larger_than_the_limit_never_fits",
    "test_concurrency_slots_free_on_settle",
    "test_concurrent_reservations_never_overshoot",
    "test_full_refund_returns_the_request_too",
    "test_random_sequences_match_the_in_process_store",
    "test_requests_per_minute_refuses_then_refills",
    "test_reservation_is_all_or_nothing",
    "test_reset_time_follows_the_token_bucket",
    "test_settle_is_once_and_unknown_ids_are_refused",
    "test_settle_refunds_unused_and_charges_overage_never_below_zero",
    "test_tokens_per_hour_counts_raw_tokens",
    "test_unlimited_keys_always_pass",
    "test_unsettled_reservations_expire_and_free_their_slot",
    "test_usage_windows",
]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1_000_000.0)


@asynccontextmanager
async def open_store(
    request: pytest.FixtureRequest, kind: str, clock: VirtualClock
) -> AsyncIterator[BudgetStore]:
    """A store of `kind` (memory, prefixed, redis, cluster, prefixed-redis), closed after."""
    made: BudgetStore
    owner: BudgetStore | None = None
    if kind == "memory":
        made = InProcessStore(clock)
    elif kind == "prefixed":
        made = PrefixedStore(InProcessStore(clock), "candidate:")
    elif kind in ("redis", "prefixed-redis"):
        port = request.getfixturevalue("redis_port")
        made = owner = RedisStore(connect(f"redis://127.0.0.1:{port}"), clock)
        if kind == "prefixed-redis":  # it owns nothing: `owner` is closed below
            made = PrefixedStore(owner, "candidate:")
    else:
        ports = request.getfixturevalue("cluster_ports")
        made = RedisStore(connect(f"redis://127.0.0.1:{ports[0]}", cluster=True), clock)
    yield made
    await (owner or made).close()


def new_key() -> str:
    return uuid.uuid4().hex[:12]


def rid() -> str:
    return uuid.uuid4().hex


async def test_requests_per_minute_refuses_then_refills(
    store: BudgetStore, clock: VirtualClock
) -> None:
    key, limits = new_key(), Limits(requests_per_minute=3)
    for expected_remaining in (2, 1, 0):
        verdict = await store.reserve(key, limits, Charge(10, 10), rid(), 600)
        assert verdict.admitted and verdict.remaining_requests == expected_remaining
    refused = await store.reserve(key, limits, Charge(10, 10), rid(), 600)
    assert not refused.admitted and refused.reason == "requests"
    assert refused.retry_after_s == pytest.approx(20.0)  # one request refills in 60/3 s
    clock.advance(19.0)
    assert not (await store.reserve(key, limits, Charge(10, 10), rid(), 600)).admitted
    clock.advance(1.0)
    assert (await store.reserve(key, limits, Charge(10, 10), rid(), 600)).admitted


async def test_reservation_is_all_or_nothing(store: BudgetStore) -> None:
    key = new_key()
    limits = Limits(requests_per_minute=10, tokens_per_minute=1000)
    assert (await store.reserve(key, limits, Charge(900, 500), rid(), 600)).admitted
    refused = await store.reserve(key, limits, Charge(200, 100), rid(), 600)
    assert not refused.admitted and refused.reason == "tokens"
    assert refused.remaining_requests == 9  # the refused request took nothing
    assert refused.remaining_tokens == 100
    assert refused.retry_after_s == pytest.approx(100 * 60 / 1000)
    assert refused.limit_tokens == 1000 and refused.limit_requests == 10


async def test_a_request_larger_than_the_limit_never_fits(store: BudgetStore) -> None:
    verdict = await store.reserve(
        new_key(), Limits(tokens_per_minute=100), Charge(101, 50), rid(), 600
    )
    assert not verdict.admitted and verdict.reason == "tokens" and verdict.retry_after_s is None


async def test_concurrency_slots_free_on_settle(store: BudgetStore) -> None:
    key, limits = new_key(), Limits(concurrent_requests=2)
    first, second = rid(), rid()
    assert (await store.reserve(key, limits, Charge(1, 1), first, 600)).admitted
    assert (await store.reserve(key, limits, Charge(1, 1), second, 600)).admitted
    refused = await store.reserve(key, limits, Charge(1, 1), rid(), 600)
    assert not refused.admitted and refused.reason == "concurrency"
    assert await store.outstanding(key) == 2
    assert await store.settle(key, limits, first, Charge(1, 1))
    assert (await store.reserve(key, limits, Charge(1, 1), rid(), 600)).admitted


async def test_settle_refunds_unused_and_charges_overage_never_below_zero(
    store: BudgetStore,
) -> None:
    key, limits = new_key(), Limits(tokens_per_minute=1000, tokens_per_hour=10_000)
    small, big = rid(), rid()
    await store.reserve(key, limits, Charge(500, 400), small, 600)
    assert await store.settle(key, limits, small, Charge(100, 80))  # used less: 400 back
    after_refund = await store.reserve(key, limits, Charge(100, 10), big, 600)
    assert after_refund.remaining_tokens == 1000 - 100 - 100
    assert await store.settle(key, limits, big, Charge(5000, 4000))  # far more than reserved
    probe = await store.reserve(key, limits, Charge(1, 1), rid(), 600)
    assert not probe.admitted and probe.remaining_tokens == 0  # clamped at zero, not negative


async def test_settle_is_once_and_unknown_ids_are_refused(store: BudgetStore) -> None:
    key, limits = new_key(), Limits(tokens_per_minute=1000)
    reservation = rid()
    await store.reserve(key, limits, Charge(10, 10), reservation, 600)
    assert await store.settle(key, limits, reservation, Charge(10, 10))
    assert not await store.settle(key, limits, reservation, Charge(10, 10))
    assert not await store.settle(key, limits, rid(), None)


async def test_full_refund_returns_the_request_too(store: BudgetStore) -> None:
    key, limits = new_key(), Limits(requests_per_minute=1, tokens_per_minute=100)
    reservation = rid()
    assert (await store.reserve(key, limits, Charge(100, 100), reservation, 600)).admitted
    assert not (await store.reserve(key, limits, Charge(1, 1), rid(), 600)).admitted
    assert await store.settle(key, limits, reservation, None)  # upstream failed: refund
    assert (await store.reserve(key, limits, Charge(100, 100), rid(), 600)).admitted


async def test_unsettled_reservations_expire_and_free_their_slot(
    store: BudgetStore, clock: VirtualClock
) -> None:
    key, limits = new_key(), Limits(concurrent_requests=1, tokens_per_minute=1000)
    lost = rid()
    assert (await store.reserve(key, limits, Charge(300, 300), lost, ttl_s=30)).admitted
    assert not (await store.reserve(key, limits, Charge(1, 1), rid(), 30)).admitted
    clock.advance(30.0)
    assert await store.outstanding(key) == 0
    later = await store.reserve(key, limits, Charge(1, 1), rid(), 30)
    assert later.admitted
    assert not await store.settle(key, limits, lost, None)  # too late: already expired


async def test_usage_windows(store: BudgetStore, clock: VirtualClock) -> None:
    key, limits = new_key(), Limits()
    for used, wait_s in ((100, 0), (10, 200), (1, 150)):
        clock.advance(wait_s)
        reservation = rid()
        await store.reserve(key, limits, Charge(used, used), reservation, 600)
        await store.settle(key, limits, reservation, Charge(used * 2, used))
    assert await store.usage(key) == {60: 1.0, 300: 11.0, 3600: 111.0}
    clock.advance(3600 + 10)  # past the hour by one 10-second slot
    assert await store.usage(key) == {60: 0.0, 300: 0.0, 3600: 0.0}


async def test_tokens_per_hour_counts_raw_tokens(store: BudgetStore, clock: VirtualClock) -> None:
    key, limits = new_key(), Limits(tokens_per_hour=1000)
    assert (await store.reserve(key, limits, Charge(5000, 800), rid(), 600)).admitted
    refused = await store.reserve(key, limits, Charge(10, 300), rid(), 600)
    assert not refused.admitted and refused.reason == "hour"
    assert refused.retry_after_s == pytest.approx(100 * 3600 / 1000)


async def test_unlimited_keys_always_pass(store: BudgetStore) -> None:
    key = new_key()
    for _ in range(20):
        verdict = await store.reserve(key, Limits(), Charge(1e9, 10**9), rid(), 600)
        assert verdict.admitted and verdict.remaining_tokens is None


async def test_reset_time_follows_the_token_bucket(store: BudgetStore, clock: VirtualClock) -> None:
    key, limits = new_key(), Limits(tokens_per_minute=600)
    verdict = await store.reserve(key, limits, Charge(300, 300), rid(), 600)
    assert verdict.reset_tokens_s == pytest.approx(30.0)
    clock.advance(10)
    verdict = await store.reserve(key, limits, Charge(0, 0), rid(), 600)
    assert verdict.reset_tokens_s == pytest.approx(20.0)


async def test_concurrent_reservations_never_overshoot(store: BudgetStore) -> None:
    key, limits = new_key(), Limits(tokens_per_minute=10_000, concurrent_requests=1000)
    verdicts = await asyncio.gather(
        *(store.reserve(key, limits, Charge(137, 100), rid(), 600) for _ in range(300))
    )
    admitted = sum(v.admitted for v in verdicts)
    assert admitted == 10_000 // 137  # exactly as many as fit, never one more
    assert await store.outstanding(key) == admitted


async def test_random_sequences_match_the_in_process_store(
    store: BudgetStore, clock: VirtualClock
) -> None:
    """The Lua scripts and the Python ledger give the same answers, op by op."""
    reference_clock = VirtualClock(1_000_000.0)
    reference = InProcessStore(reference_clock)
    rng = random.Random(5)
    key = new_key()
    limits = Limits(
        requests_per_minute=7, tokens_per_minute=900, tokens_per_hour=5000, concurrent_requests=3
    )
    held: list[str] = []
    for _ in range(150):
        step = rng.choice([0.0, 0.5, 3.0, 20.0])
        clock.advance(step)
        reference_clock.advance(step)
        if held and rng.random() < 0.45:
            reservation = held.pop(rng.randrange(len(held)))
            actual = (
                None if rng.random() < 0.2 else Charge(rng.uniform(0, 400), rng.randrange(0, 300))
            )
            got = await store.settle(key, limits, reservation, actual)
            want = await reference.settle(key, limits, reservation, actual)
            assert got == want
        else:
            reservation = rid()
            charge = Charge(rng.uniform(1, 300), rng.randrange(1, 300))
            got_v = await store.reserve(key, limits, charge, reservation, 45)
            want_v = await reference.reserve(key, limits, charge, reservation, 45)
            assert got_v.admitted == want_v.admitted and got_v.reason == want_v.reason
            assert got_v.remaining_tokens == want_v.remaining_tokens
            assert got_v.remaining_requests == want_v.remaining_requests
            if want_v.retry_after_s is None:
                assert got_v.retry_after_s is None
            else:
                assert got_v.retry_after_s == pytest.approx(want_v.retry_after_s)
            if got_v.admitted:
                held.append(reservation)
    assert await store.outstanding(key) == await reference.outstanding(key)
    assert await store.usage(key) == await reference.usage(key)
