"""The fleet's KV ledger in Redis, and the replicas' heartbeats.

What lives here: `RedisBook`, an admission.kv.book.SharedBook whose arithmetic runs in Lua
(admission/kv/lua/kv_*.lua, the same as admission.kv.capacity's, one test suite holds both),
and `FleetMembers`, which says how many replicas are alive from their heartbeats in the
store. The one module of admission that does I/O (import-linter names the exception).

Each pool's ledger is four keys under the pool's hash tag (`slogate:kv:{<pool>}:...`), so
every script touches one Redis Cluster slot: the totals (tokens, fixed, batch slots, the
footprint ratio, and counts of what releases gave back), the holds (id -> footprint), their
deadlines, and the replicas' blocked heads of line. The tenants' attained service is one
hash for the fleet (`slogate:{fleet}:service`), the heartbeats another. A hold's deadline is the
Redis server's TIME plus its ttl, so a replica killed while holding frees its holds at their
deadlines (every hold expires the pool's late holds first; the housekeeping loop too).

A replica keeps the pools' totals from its last reply (`view`): the waiting room reads them
to judge whether a blocked request's room is coming, and when it offers a waiting request
that the view already says cannot fit (read within the last 50 ms, `trust_full_s`), the
offer is refused without a round trip, so a full pool with thousands waiting costs no Redis
call per offer. A new request always asks. The waiting room's tick refreshes the
pools that have requests waiting, every 50 ms: that is how one replica learns of the room
another replica's ends freed.

Budget and KV admission are two round trips, not one: a budget's keys carry the API key's
hash tag and a pool's ledger the pool's, which a Redis Cluster puts in different slots (one
script may touch one slot), and a request may wait for KV room between the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from admission.kv.book import Hold, HoldAsk, LedgerUnavailable
from admission.kv.capacity import (
    Freed,
    HeadOfLine,
    KvLedger,
    PoolCapacity,
    PoolView,
    pool_capacity,
)
from budget.redis_scripts import LuaStore, Scripts
from budget.store import BudgetStoreError
from policy.domain import Pool


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


_TOTALS = ("tokens", "fixed", "sequences", "ratio", "freed_tokens", "freed_sequences", "ends")


def _view(values: list[Any]) -> PoolView:
    """The pool's totals, in _TOTALS order (a kv_*.lua reply's, or an HMGET's)."""
    text = [None if v is None else _text(v) for v in values]
    counts = [int(float(v or 0)) for v in text]
    return PoolView(
        counts[0],
        counts[1],
        counts[2],
        float(text[3] or 1.0),
        counts[4],
        counts[5],
        counts[6],
    )


class RedisBook(LuaStore):
    COMMON = "kv_common.lua"
    SCRIPTS = (
        "kv_hold.lua",
        "kv_release.lua",
        "kv_expire.lua",
        "kv_adopt.lua",
        "kv_ratio.lua",
        "kv_head.lua",
        "kv_service.lua",
    )
    PACKAGE = "admission.kv"  # whose lua/ folder holds them (time.lua stays in budget/lua/)
    # A view older than this never refuses a hold without asking: the waiting room's tick,
    # so a request is refused on a stale count at most as late as the tick would see it.
    trust_full_s = 0.05

    def __init__(
        self,
        client: Any,
        clock: Callable[[], float] | None = None,
        prefix: str = "slogate",
        timeout_s: float | None = None,
        local_clock: Callable[[], float] = time.monotonic,
        ratio_gap_s: float = 4.0,
    ) -> None:
        """`client`, `clock`, `prefix`, `timeout_s`: as every LuaStore's. `local_clock`: when
        this replica read a view. `ratio_gap_s`: the least time between two steps down of a
        pool's ratio, whoever learns them (about the controller interval)."""
        super().__init__(client, clock, prefix, timeout_s)
        self._local_clock = local_clock
        self._ratio_gap_s = ratio_gap_s
        self._views: dict[str, tuple[PoolView, float]] = {}  # pool -> (view, read at)
        self._mine: dict[str, Freed] = {}  # this replica's holds: id -> what it holds
        self._tokens: dict[str, int] = {}
        self._sequences: dict[str, int] = {}
        self._learner = KvLedger()  # the ratio arithmetic, fed the fleet's counts

    def _keys(self, pool: str) -> list[str]:
        parts = ("totals", "holds", "due", "heads")
        return [f"{self._prefix}:kv:{{{pool}}}:{part}" for part in parts]

    async def _run(self, name: str, pool: str, args: list[Any]) -> list[Any]:
        try:
            reply = await self._scripts.run(name, self._keys(pool), args)
        except BudgetStoreError as error:
            raise LedgerUnavailable(str(error)) from error
        self._views[pool] = (_view(reply[1:8]), self._local_clock())
        return list(reply)

    def capacity(self, spec: Pool) -> PoolCapacity | None:
        return pool_capacity(spec)  # the whole pool: every replica admits against it

    def view(self, pool: str) -> PoolView:
        known = self._views.get(pool)
        return known[0] if known is not None else PoolView()

    async def hold(self, ask: HoldAsk) -> str:
        capacity = self.capacity(ask.spec) or PoolCapacity(None, None)
        known = self._views.get(ask.pool) if ask.trust_view else None
        if known is not None and self._local_clock() - known[1] <= self.trust_full_s:
            full = known[0].over(capacity, ask.share, ask.tokens, ask.sequences, ask.fixed)
            if full:
                return full  # full a moment ago: no round trip (the room asks again later)
        reply = await self._run(
            "kv_hold.lua",
            ask.pool,
            [
                self._now_arg(),
                ask.request_id,
                ask.tokens,
                ask.sequences,
                1 if ask.fixed else 0,
                repr(float(ask.ttl_s)),
                -1 if capacity.kv_tokens is None else repr(float(capacity.kv_tokens)),
                -1 if capacity.sequences is None else repr(float(capacity.sequences)),
                repr(float(ask.share)),
                ask.owner,
                ask.rank,
            ],
        )
        limit = _text(reply[0])
        if not limit:
            self._note(ask.request_id, Freed(ask.pool, ask.tokens, ask.sequences))
        return limit

    async def publish_head(
        self, pool: str, owner: str, head: HeadOfLine | None, ttl_s: float
    ) -> None:
        if head is None:
            args: list[Any] = [self._now_arg(), owner, "", 0, 0, 0, 0]
        else:
            args = [
                self._now_arg(),
                owner,
                head.request_id,
                head.rank,
                repr(float(head.expected_tokens)),
                head.sequences,
                repr(float(ttl_s)),
            ]
        try:
            await self._scripts.run("kv_head.lua", self._keys(pool), args)
        except BudgetStoreError as error:
            raise LedgerUnavailable(str(error)) from error

    @property
    def fleet_wide(self) -> bool:
        return True

    async def share_service(
        self, added: list[tuple[str, float, float]], half_life_s: float, now_s: float
    ) -> dict[str, float]:
        """One hash for the fleet (`slogate:{fleet}:service`): tenant -> decaying value."""
        args: list[Any] = [self._now_arg(), repr(float(half_life_s))]
        for tenant, amount, at_s in added:
            args += [tenant, repr(float(amount)), repr(max(0.0, now_s - at_s))]
        try:
            raw = await self._scripts.run(
                "kv_service.lua", [f"{self._prefix}:{{fleet}}:service"], args
            )
        except BudgetStoreError as error:
            raise LedgerUnavailable(str(error)) from error
        return {_text(raw[i]): float(_text(raw[i + 1])) for i in range(0, len(raw), 2)}

    def _note(self, request_id: str, held: Freed) -> None:
        self._mine[request_id] = held
        self._tokens[held.pool] = self._tokens.get(held.pool, 0) + held.tokens
        self._sequences[held.pool] = self._sequences.get(held.pool, 0) + held.sequences

    def forget(self, request_id: str) -> Freed | None:
        held = self._mine.pop(request_id, None)
        if held is not None:
            self._tokens[held.pool] -= held.tokens
            self._sequences[held.pool] -= held.sequences
        return held

    async def release(self, request_id: str) -> Freed | None:
        held = self._mine.get(request_id)
        if held is None:
            return None
        await self._run("kv_release.lua", held.pool, [request_id])
        return self.forget(request_id)

    async def release_ids(self, ids: Mapping[str, str]) -> None:
        for request_id, pool in ids.items():
            await self._run("kv_release.lua", pool, [request_id])
            self.forget(request_id)

    async def expire(self, pools: Iterable[str]) -> list[tuple[str, Freed]]:
        expired: list[tuple[str, Freed]] = []
        for pool in pools:
            reply = await self._run("kv_expire.lua", pool, [self._now_arg(), 1000])
            for raw in reply[8:]:
                freed = self.forget(_text(raw))
                if freed is not None:
                    expired.append((_text(raw), freed))
        return expired

    async def refresh(self, pools: Iterable[str]) -> None:
        for pool in pools:
            totals = self._keys(pool)[0]
            raw = await self._command("refresh", self._scripts.client.hmget(totals, *_TOTALS))
            self._views[pool] = (_view(list(raw)), self._local_clock())

    async def _command(self, what: str, call: Any) -> Any:
        try:
            return await self._scripts.command(what, call)
        except BudgetStoreError as error:
            raise LedgerUnavailable(str(error)) from error

    async def observe(
        self, pools: Mapping[str, Pool], kv_cache_usage: Callable[[str], float | None]
    ) -> list[str]:
        """The ratio is learned from the fleet's count against the whole pool (every replica
        scrapes the same engines) and kept in the store, so every replica admits with it."""
        limited = {
            name: capacity
            for name, pool in pools.items()
            if (capacity := pool_capacity(pool)) is not None and capacity.kv_tokens is not None
        }
        await self.refresh(limited)
        observed = []
        for name, capacity in limited.items():
            view = self.view(name)
            learner = self._learner
            learner.in_flight[name], learner.fixed[name] = view.tokens, view.fixed
            learner.ratio[name] = view.ratio
            learner.observe(name, kv_cache_usage(name), capacity.kv_tokens or math.inf)
            learned = learner.ratio.get(name, 1.0)
            if learned != view.ratio:
                stored = await self._ratio(name, learned)
                learner.ratio[name] = stored
                self._views[name] = (
                    dataclasses.replace(view, ratio=stored),
                    self._local_clock(),
                )
            observed.append(name)
        return observed

    async def _ratio(self, pool: str, ratio: float) -> float:
        totals = self._keys(pool)[0]
        try:
            raw = await self._scripts.run(
                "kv_ratio.lua", [totals], [self._now_arg(), repr(ratio), self._ratio_gap_s]
            )
        except BudgetStoreError as error:
            raise LedgerUnavailable(str(error)) from error
        return float(_text(raw))

    async def adopt(self, holds: list[Hold]) -> None:
        by_pool: dict[str, list[Hold]] = {}
        for hold in holds:
            by_pool.setdefault(hold.pool, []).append(hold)
        for pool, group in by_pool.items():
            args: list[Any] = [self._now_arg()]
            for hold in group:
                fixed = 1 if hold.fixed else 0
                args += [hold.request_id, hold.tokens, hold.sequences, fixed, repr(hold.ttl_s)]
            await self._run("kv_adopt.lua", pool, args)
            for hold in group:
                self._note(hold.request_id, Freed(pool, hold.tokens, hold.sequences))

    def held_by_pool(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        return self._tokens, self._sequences

    @property
    def holds(self) -> int:
        return len(self._mine)


class FleetMembers:
    """How many sidecar replicas are alive: each writes a heartbeat (a zset member scored
    by the Redis server's time) every `interval_s`; a replica silent for `dead_after`
    intervals no longer counts. `live` is the last count read, or `fallback` (the policy's
    `replicas`) until one was read: what a replica divides a pool by when it must decide
    alone."""

    def __init__(
        self,
        client: Any,
        fallback: Callable[[], int],
        interval_s: float = 2.0,
        dead_after: float = 3.0,
        prefix: str = "slogate",
        replica_id: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._scripts = Scripts(client, {}, timeout_s)
        self._fallback = fallback
        self.interval_s = interval_s
        self._dead_after = dead_after
        self._key = f"{prefix}:{{fleet}}:replicas"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self._live: int | None = None

    def live(self) -> int:
        return self._live if self._live is not None else max(1, self._fallback())

    async def beat(self) -> int:
        """Write this replica's heartbeat, drop the dead, count the living."""
        client = self._scripts.client
        try:
            seconds, micros = await self._scripts.command("time", client.time())
            now_s = float(seconds) + float(micros) / 1e6
            await self._scripts.command("zadd", client.zadd(self._key, {self.replica_id: now_s}))
            horizon = now_s - self._dead_after * self.interval_s
            await self._scripts.command("zrem", client.zremrangebyscore(self._key, "-inf", horizon))
            self._live = max(1, int(await self._scripts.command("zcard", client.zcard(self._key))))
        except BudgetStoreError:
            pass  # the last count stands: the outage is when it is needed
        return self.live()

    async def leave(self) -> None:
        with contextlib.suppress(BudgetStoreError):  # its heartbeat ages out anyway
            await self._scripts.command(
                "zrem", self._scripts.client.zrem(self._key, self.replica_id)
            )
