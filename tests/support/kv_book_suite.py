"""ONE suite, every KV ledger: this process's (admission.kv.book.LocalBook), the fleet's in a
real Redis and in a 3-node Redis Cluster (admission.kv.redis_ledger.RedisBook).

A virtual clock is injected where the suite moves time; production Redis books use the
server's TIME. The tests below are collected where they are imported with `*`, each module
defining the `fleet` fixture over its kinds with `Fleet`: tests/admission/kv/test_book.py on
this process's book, tests/e2e/admission/kv/test_book.py on Redis and the Cluster.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from admission.kv.book import HoldAsk, KvBook, LocalBook
from admission.kv.capacity import HeadOfLine
from admission.kv.redis_ledger import RedisBook
from budget.redis_store import connect
from policy.domain import Pool
from policy.loader import parse_policy
from tests.support.clock import VirtualClock

__all__ = [
    "clock",
    "test_a_retried_hold_is_the_same_hold",
    "test_batch_slots_and_fixed_footprints",
    "test_each_tier_fills_the_pool_up_to_its_share",
    "test_holds_past_their_deadline_expire",
    "test_other_replicas_leave_room_for_a_blocked_head_of_line",
]

BASE = parse_policy({}).pools["default"]


def pool(kv: int | None = 10_000, seqs: int | None = None) -> Pool:
    return dataclasses.replace(
        BASE, name=f"p{uuid.uuid4().hex[:8]}", kv_capacity_tokens=kv, max_num_seqs=seqs
    )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1_000_000.0)


class Fleet:
    """Books that share one ledger: replicas of one fleet (local: one book, shared)."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, clock: VirtualClock) -> None:
        self.kind = kind
        self.clock = clock
        self._clients: list[object] = []
        self._local = LocalBook(clock)
        self._request = request

    def replica(self) -> KvBook:
        if self.kind == "local":
            return self._local
        if self.kind == "redis":
            port = self._request.getfixturevalue("redis_port")
            client = connect(f"redis://127.0.0.1:{port}")
        else:
            ports = self._request.getfixturevalue("cluster_ports")
            client = connect(f"redis://127.0.0.1:{ports[0]}", cluster=True)
        self._clients.append(client)
        return RedisBook(client, clock=self.clock, local_clock=self.clock)

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()  # type: ignore[attr-defined]


async def hold(
    book: KvBook, rid: str, spec: Pool, tokens: int, share: float = 1.0, **kw: object
) -> str:
    """`kw`: the other HoldAsk fields (ttl_s defaults to 600 s)."""
    fields: dict[str, object] = {"ttl_s": 600.0, **kw}
    return await book.hold(HoldAsk(rid, spec.name, spec, tokens, share, **fields))  # type: ignore[arg-type]


async def test_each_tier_fills_the_pool_up_to_its_share(fleet: Fleet) -> None:
    book, spec = fleet.replica(), pool()
    assert await hold(book, "a", spec, 8000, share=0.85) == ""
    assert await hold(book, "b", spec, 1000, share=0.85) == "kv_cache"
    assert await hold(book, "c", spec, 1000, share=1.0) == ""  # critical: the top 15%
    freed = await book.release("a")
    assert freed is not None and (freed.pool, freed.tokens, freed.sequences) == (spec.name, 8000, 1)
    assert await book.release("a") is None  # released once
    assert await book.release("b") is None  # never held
    view = book.view(spec.name)
    assert (view.tokens, view.sequences) == (1000, 1) and book.holds == 1


async def test_batch_slots_and_fixed_footprints(fleet: Fleet) -> None:
    book, spec = fleet.replica(), pool(kv=10_000, seqs=10)
    assert await hold(book, "n8", spec, 10, sequences=8) == ""
    assert await hold(book, "n4", spec, 10, sequences=4) == "sequences"
    assert await hold(book, "f", spec, 3000, fixed=True) == ""
    view = book.view(spec.name)
    assert (view.tokens, view.fixed, view.sequences) == (3010, 3000, 9)
    await book.release("f")
    assert book.view(spec.name).fixed == 0


async def test_a_retried_hold_is_the_same_hold(fleet: Fleet) -> None:
    """A hold whose reply was lost is sent again: it must not be counted twice."""
    book, spec = fleet.replica(), pool()
    assert await hold(book, "r", spec, 4000) == ""
    assert await hold(book, "r", spec, 4000) == ""
    assert book.view(spec.name).tokens == 4000


async def test_holds_past_their_deadline_expire(fleet: Fleet, clock: VirtualClock) -> None:
    book, spec = fleet.replica(), pool()
    await hold(book, "short", spec, 6000, ttl_s=10)
    await hold(book, "long", spec, 1000, ttl_s=100)
    clock.advance(11)
    expired = await book.expire([spec.name])
    assert [rid for rid, _ in expired] == ["short"] and expired[0][1].tokens == 6000
    assert book.view(spec.name).tokens == 1000 and book.holds == 1


async def test_other_replicas_leave_room_for_a_blocked_head_of_line(
    fleet: Fleet, clock: VirtualClock
) -> None:
    """Replica a's room holds its pool for a large standard request: replica b's standard
    requests leave it room, its critical ones do not; of two heads of one tier, the later
    one leaves room for the earlier, never the other way round; an admitted head, or one
    not published again within its ttl, holds nothing back."""
    a, b, spec = fleet.replica(), fleet.replica(), pool(kv=10_000)
    assert await hold(a, "running", spec, 3000) == ""
    head = HeadOfLine("big", rank=1, expected_tokens=6000.0, sequences=1)
    await a.publish_head(spec.name, "a", head, ttl_s=10)
    assert await hold(b, "s1", spec, 2000, owner="b", rank=1) == "kv_cache"  # 3000+2000+6000
    assert await hold(b, "c1", spec, 2000, owner="b", rank=0) == ""  # critical: not behind it
    clock.advance(1)
    later = HeadOfLine("b-big", rank=1, expected_tokens=4000.0, sequences=1)
    await b.publish_head(spec.name, "b", later, ttl_s=10)
    assert await hold(b, "b-big", spec, 4000, owner="b", rank=1) == "kv_cache"  # a's is older
    assert await hold(a, "big", spec, 5000, owner="a", rank=1) == ""  # b's is younger: no room
    assert await hold(b, "b-big", spec, 4000, owner="b", rank=1) == "kv_cache"  # just full
    await b.release("c1")
    await a.release("running")
    assert await hold(b, "b-big", spec, 4000, owner="b", rank=1) == ""  # a's was taken
    await a.publish_head(spec.name, "a", HeadOfLine("huge", 2, 9000.0, 1), ttl_s=0.25)
    assert await hold(b, "s2", spec, 500, owner="b", rank=2) == "kv_cache"
    clock.advance(0.3)
    assert await hold(b, "s2", spec, 500, owner="b", rank=2) == ""  # a went quiet
    await a.publish_head(spec.name, "a", HeadOfLine("huge", 2, 9000.0, 1), ttl_s=10)
    await a.publish_head(spec.name, "a", None, ttl_s=10)  # no head any more
    assert await hold(b, "s3", spec, 100, owner="b", rank=2) == ""
