"""ONE suite, every KV ledger (tests/support/kv_book_suite.py), run here on the fleet's
ledger in a real Redis and a 3-node Redis Cluster (admission.kv.redis_ledger.RedisBook); what
only replicas sharing one ledger can show; and the failover between the shared book and this
process's while Redis dies and comes back. This process's book: tests/admission/kv/test_book.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from admission.kv.book import FailoverBook, LocalBook
from admission.kv.redis_ledger import FleetMembers, RedisBook
from budget.redis_store import connect
from extproc.runtime.processes import ManagedProcess
from tests.support.clock import VirtualClock
from tests.support.kv_book_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.kv_book_suite import Fleet, hold, pool
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis


@pytest.fixture(params=["redis", "cluster"])
async def fleet(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[Fleet]:
    made = Fleet(request.param, request, clock)
    yield made
    await made.close()


@pytest.fixture(params=["redis", "cluster"])
async def shared(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[Fleet]:
    """The books several replicas share: Redis and the Cluster."""
    made = Fleet(request.param, request, clock)
    yield made
    await made.close()


async def test_the_same_sequences_as_this_process_ledger(
    shared: Fleet, clock: VirtualClock
) -> None:
    """Random holds, releases and expiries: every book decides as the in-process one."""
    book, spec = shared.replica(), pool(kv=20_000, seqs=12)
    reference = LocalBook(clock)
    rng = random.Random(5)
    held: list[str] = []
    for step in range(300):
        action = rng.random()
        if action < 0.6 or not held:
            rid = f"h{step}"
            args = {
                "share": rng.choice([0.85, 0.95, 1.0]),
                "sequences": rng.choice([1, 1, 2]),
                "fixed": rng.random() < 0.2,
                "ttl_s": rng.choice([5.0, 50.0, 500.0]),
            }
            tokens = rng.randint(100, 6000)
            got = await hold(book, rid, spec, tokens, **args)  # type: ignore[arg-type]
            want = await hold(reference, rid, spec, tokens, **args)  # type: ignore[arg-type]
            assert got == want, step
            if not got:
                held.append(rid)
        elif action < 0.9:
            rid = held.pop(rng.randrange(len(held)))
            assert await book.release(rid) == await reference.release(rid), step
        else:
            clock.advance(rng.choice([1.0, 10.0]))
            got_ids = sorted(r for r, _ in await book.expire([spec.name]))
            want_ids = sorted(r for r, _ in await reference.expire([spec.name]))
            assert got_ids == want_ids, step
            held = [r for r in held if r not in want_ids]
        got, want = book.view(spec.name), reference.view(spec.name)
        assert dataclasses.replace(got, ratio=1.0) == dataclasses.replace(want, ratio=1.0), step


async def test_replicas_admit_against_the_whole_pool(shared: Fleet) -> None:
    """A request needing 60% of an empty pool fits through any replica; the second one
    does not, whichever replica it comes through."""
    first, second, spec = shared.replica(), shared.replica(), pool()
    assert await hold(first, "big", spec, 6000) == ""
    assert await hold(second, "big2", spec, 6000) == "kv_cache"
    assert await hold(second, "small", spec, 4000) == ""
    assert first.holds == 1 and second.holds == 1
    await second.refresh([spec.name])
    assert second.view(spec.name).tokens == 10_000  # the shared's count, not its own
    assert dict(second.held_by_pool()[0]) == {spec.name: 4000}  # what it holds itself
    assert await second.release("big") is None  # not its hold: it cannot free it
    await first.release("big")
    # Offered from the waiting room: full a moment ago, so refused without a round trip
    # until the view is read again (the room's tick refreshes it every 50 ms) ...
    assert await hold(second, "big2", spec, 6000, trust_view=True) == "kv_cache"
    assert second.view(spec.name).tokens == 10_000  # (not read again)
    assert await hold(second, "big2", spec, 6000) == ""  # ... a new request always asks


async def test_concurrent_holds_never_overshoot_the_pool(shared: Fleet) -> None:
    books, spec = [shared.replica() for _ in range(3)], pool(kv=50_000)
    limits = await asyncio.gather(*(hold(books[i % 3], f"c{i}", spec, 1000) for i in range(120)))
    assert limits.count("") == 50
    await books[0].refresh([spec.name])
    assert books[0].view(spec.name).tokens == 50_000


async def test_a_dead_replicas_holds_free_at_their_deadline(
    shared: Fleet, clock: VirtualClock
) -> None:
    """A replica killed while holding never releases: any other replica's next hold frees
    the late holds first."""
    dead, alive, spec = shared.replica(), shared.replica(), pool()
    assert await hold(dead, "orphan", spec, 9000, ttl_s=30) == ""
    assert await hold(alive, "x", spec, 5000) == "kv_cache"
    clock.advance(31)
    assert await hold(alive, "x", spec, 5000) == ""
    assert alive.view(spec.name).tokens == 5000


async def test_the_ratio_is_the_fleets_and_steps_down_once_per_interval(
    shared: Fleet, clock: VirtualClock
) -> None:
    books, spec = [shared.replica() for _ in range(3)], pool(kv=10_000)
    pools = {spec.name: spec}
    for i in range(4):
        assert await hold(books[i % 3], f"r{i}", spec, 2000) == ""
    for book in books:  # each learns from the same engine: 2000 of 8000 counted are real
        await book.observe(pools, lambda _: 0.2)
    ratios = [book.view(spec.name).ratio for book in books]
    assert ratios == [pytest.approx(0.925)] * 3  # one step down (0.1 of the way), not three
    clock.advance(5)
    await books[1].observe(pools, lambda _: 0.9)  # fuller than thought: up at once ...
    await books[2].refresh([spec.name])
    assert books[2].view(spec.name).ratio == 1.0  # ... to the count; past it when sustained
    for _ in range(2):
        await books[1].observe(pools, lambda _: 0.9)
    await books[2].refresh([spec.name])
    assert books[2].view(spec.name).ratio == pytest.approx(0.9 * 10_000 / 8000)


async def test_tenants_attained_service_is_the_fleets(shared: Fleet, clock: VirtualClock) -> None:
    """Two replicas each see what the other's tenants attained (decaying with the
    half-life, from when it was attained), so fair shares hold across the fleet."""
    a, b = shared.replica(), shared.replica()
    tenant = f"t{uuid.uuid4().hex[:6]}"
    now = clock()
    seen = await a.share_service([(tenant, 1000.0, now - 60.0)], 60.0, now)
    assert seen[tenant] == pytest.approx(500.0)  # attained a half-life ago
    seen = await b.share_service([(tenant, 500.0, now)], 60.0, now)
    assert seen[tenant] == pytest.approx(1000.0)
    clock.advance(60)
    assert (await a.share_service([], 60.0, clock()))[tenant] == pytest.approx(500.0)
    clock.advance(600)
    assert tenant not in await a.share_service([], 60.0, clock())  # decayed to nothing


# -- the failover: a Redis that dies and comes back -------------------------------------


class _Restartable:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        self.proc, _ = start_redis(self.tmp, port=self.port)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.stop()


async def test_local_shares_while_redis_is_away_then_whole_again(tmp_path: Path) -> None:
    server = _Restartable(tmp_path)
    server.start()
    clock = VirtualClock(0.0)
    client = connect(f"redis://127.0.0.1:{server.port}")
    shared = RedisBook(client, timeout_s=0.5)
    members = FleetMembers(client, lambda: 2, timeout_s=0.5)
    other = FleetMembers(connect(f"redis://127.0.0.1:{server.port}"), lambda: 2, timeout_s=0.5)
    decisions: list[bool] = []
    book = FailoverBook(shared, LocalBook(clock, members.live), clock, 1.0, decisions.append)
    spec = pool(kv=10_000)
    try:
        assert await members.beat() == 1 and await other.beat() == 2
        assert await members.beat() == 2 and members.live() == 2
        assert await hold(book, "before", spec, 7000) == ""  # 70%: the whole pool's
        server.stop()
        # Away: each of the 2 live replicas admits against half of the pool.
        assert await hold(book, "during", spec, 6000) == "kv_cache"
        assert await hold(book, "d2", spec, 4000) == ""
        assert decisions[-2:] == [False, False] and not book.healthy
        assert book.capacity(spec).kv_tokens == 5000  # type: ignore[union-attr]
        freed = await book.release("before")  # its release cannot reach Redis: kept for later
        assert freed is not None and freed.tokens == 7000
        server.start()  # an empty Redis (no persistence): the holds are gone with it
        clock.advance(2)
        assert await hold(book, "after", spec, 5000) == ""
        assert book.healthy and decisions[-1] is True
        await shared.refresh([spec.name])
        view = shared.view(spec.name)
        assert (view.tokens, view.sequences) == (9000, 2)  # d2 adopted, before released
        assert await book.release("d2") is not None and await book.release("after")
        await shared.refresh([spec.name])
        assert shared.view(spec.name).tokens == 0 and book.holds == 0
    finally:
        await client.aclose()
        server.stop()


async def test_a_hold_that_cannot_reach_redis_is_never_left_there(tmp_path: Path) -> None:
    """A hold that times out may still have run in Redis: it is released there once Redis
    answers, so no phantom hold outlives the outage."""
    server = _Restartable(tmp_path)
    server.start()
    clock = VirtualClock(0.0)
    client = connect(f"redis://127.0.0.1:{server.port}")
    shared = RedisBook(client, timeout_s=0.5)
    book = FailoverBook(shared, LocalBook(clock), clock, 1.0)
    spec = pool(kv=10_000)
    try:
        assert await hold(book, "warm", spec, 10) == "" and await book.release("warm")
        pause = await client.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        assert pause in (True, b"OK", "OK")
        assert await hold(book, "lost", spec, 3000) == ""  # timed out: decided locally
        assert not book.healthy
        await asyncio.sleep(1.6)
        clock.advance(2)
        assert await hold(book, "next", spec, 10) == ""
        await shared.refresh([spec.name])
        # "lost" ran in Redis after the pause, was released there, then adopted from the
        # local ledger: counted once.
        assert shared.view(spec.name).tokens == 3010
        assert await book.release("lost") is not None
        await shared.refresh([spec.name])
        assert shared.view(spec.name).tokens == 10
    finally:
        await client.aclose()
        server.stop()
