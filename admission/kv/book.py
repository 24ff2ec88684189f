"""Where the KV ledger lives: in this process, or shared by every replica of the fleet.

What lives here: `KvBook`, what KV admission (admission.kv.step and admission.kv.dispatch)
asks of a ledger; `LocalBook`, a process's own ledger (admission.kv.capacity.KvLedger) on
its clock; and `FailoverBook`, the fleet's shared ledger (Redis: admission.kv.redis_ledger)
with a local share behind it. Pure: no I/O here; the shared book is passed in.

Why one fleet-wide ledger: with N sidecar replicas in front of a pool and a ledger each,
each may admit only capacity / N, so a request needing more than one replica's part is
refused while the pool is empty, and a static N is wrong the moment an autoscaler moves the
pod count. With the shared ledger every replica admits against the whole pool, atomically.

When the shared ledger cannot be reached, each replica decides alone against
capacity / (live replicas), the count taken from the replicas' heartbeats (the policy's
`replicas` only when none were ever seen), so the replicas together stay near the pool's
capacity. When it answers again, the holds made locally are handed to it (adopted, without
a capacity check: they run already) and every hold whose release or hold may have been
lost is released there, so the fleet's count is whole again and nothing is counted twice.

Each replica has its own waiting room, and a room holds its pool for a large request that
has waited past `backfill_s` (admission.waiting_room): nothing of its replica passes it.
Other replicas would pass it, filling the room its pool frees with smaller requests, so the
large one never fits. So a replica publishes its blocked head of line per pool (every room
tick, forgotten 0.25 s after the last), and every other replica's admissions leave free
what the heads ahead of them need (admission.kv.capacity.HeadBoard: the order between heads
is their tier, then since when each has been a head).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from admission.kv.capacity import (
    Freed,
    HeadBoard,
    HeadOfLine,
    KvLedger,
    PoolCapacity,
    PoolView,
    pool_capacity,
)
from budget.failover import Outage
from policy.domain import Pool

log = logging.getLogger("slogate.kv")


class LedgerUnavailable(RuntimeError):
    """The shared ledger could not answer (Redis down or slow); the caller may degrade."""


class Hold(NamedTuple):
    """One request's hold, as handed from a local ledger to the shared one."""

    request_id: str
    pool: str
    tokens: int
    sequences: int
    fixed: bool
    ttl_s: float


@dataclass(frozen=True, slots=True)
class HoldAsk:
    """One request's footprint, asked of a ledger: `tokens` of KV and `sequences` batch
    slots of `pool` (`spec`), within its tier's `share`, freed at `ttl_s` if nothing
    releases it before. `fixed`: it runs to its limit (never discounted by the ratio).
    `trust_view`: a shared book may refuse from the footprint it read a moment ago, without
    asking (the waiting room's offers: it asks again at its next tick). `owner`, `rank`:
    the asking replica and the tier's place (0: critical), to leave free what other
    replicas' blocked heads of line ahead of it need (no owner: nothing)."""

    request_id: str
    pool: str
    spec: Pool
    tokens: int
    share: float
    ttl_s: float
    sequences: int = 1
    fixed: bool = False
    trust_view: bool = False
    owner: str = ""
    rank: int = 0


class KvBook(Protocol):
    def capacity(self, spec: Pool) -> PoolCapacity | None:
        """What this replica admits against in `spec`'s pool now (None: not limited)."""
        ...

    def view(self, pool: str) -> PoolView:
        """The pool's committed footprint as last known (the whole fleet's when shared)."""
        ...

    async def hold(self, ask: HoldAsk) -> str:
        """Hold the footprint if the tier's share leaves room: "" when held, else what is
        full ("kv_cache", "sequences")."""
        ...

    async def publish_head(
        self, pool: str, owner: str, head: HeadOfLine | None, ttl_s: float
    ) -> None:
        """`owner`'s blocked head of line in `pool` for the next `ttl_s` (None: none)."""
        ...

    @property
    def fleet_wide(self) -> bool:
        """Whether other replicas share this book (their heads, their tenants' service)."""
        ...

    async def share_service(
        self, added: list[tuple[str, float, float]], half_life_s: float, now_s: float
    ) -> dict[str, float]:
        """Add this replica's attained service since the last call — (tenant, amount, at
        on the caller's clock `now_s` runs on) — to the fleet's, and return the fleet's
        value of every tenant with any, decayed to now."""
        ...

    async def release(self, request_id: str) -> Freed | None:
        """Free what the request holds; None when it holds nothing."""
        ...

    async def expire(self, pools: Iterable[str]) -> list[tuple[str, Freed]]:
        """Free this replica's holds past their deadline (the shared book also frees dead
        replicas' holds); what each of this replica's ids freed."""
        ...

    async def refresh(self, pools: Iterable[str]) -> None:
        """Read the pools' footprints again (others' admissions and ends)."""
        ...

    async def observe(
        self, pools: Mapping[str, Pool], kv_cache_usage: Callable[[str], float | None]
    ) -> list[str]:
        """Learn each limited pool's footprint ratio from its engines' KV usage; the pools
        observed."""
        ...

    def held_by_pool(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(KV tokens, batch slots) this replica's admissions hold per pool."""
        ...

    @property
    def holds(self) -> int:
        """How many holds this replica's admissions have."""
        ...


class LocalBook:
    """A ledger in this process: one sidecar's, or every simulated sidecar's at once (the
    simulator shares one as the fleet shares Redis). `replicas`: how many split the pool.
    `ratio_gap_s`: the least time between two observations (a shared book is observed by
    every sidecar; it learns once per interval, like the shared ledger's kv_ratio.lua)."""

    def __init__(
        self,
        clock: Callable[[], float],
        replicas: Callable[[], int] = lambda: 1,
        ledger: KvLedger | None = None,
        ratio_gap_s: float = 0.0,
        shared: bool = False,
    ) -> None:
        self._clock = clock
        self._shared = shared
        self._service: dict[str, tuple[float, float]] = {}  # tenant -> (value, at)
        self._replicas = replicas
        self.ledger = ledger or KvLedger()
        self._ratio_gap_s = ratio_gap_s
        self._observed_s = -math.inf
        self.heads = HeadBoard()

    def capacity(self, spec: Pool) -> PoolCapacity | None:
        return pool_capacity(spec, max(1, self._replicas()))

    def view(self, pool: str) -> PoolView:
        return self.ledger.view(pool)

    async def hold(self, ask: HoldAsk) -> str:
        capacity = self.capacity(ask.spec) or PoolCapacity(None, None)
        now_s = self._clock()
        held_back = (
            self.heads.held_back(ask.pool, ask.owner, ask.request_id, ask.rank, now_s)
            if ask.owner
            else None
        )
        verdict = self.ledger.admit(
            ask.request_id,
            ask.pool,
            ask.tokens,
            capacity,
            ask.share,
            ask.sequences,
            ask.fixed,
            now_s + ask.ttl_s,
            held_back,
        )
        if verdict.admitted and ask.owner:
            self.heads.taken(ask.pool, ask.owner, ask.request_id)
        return verdict.limit

    async def publish_head(
        self, pool: str, owner: str, head: HeadOfLine | None, ttl_s: float
    ) -> None:
        now_s = self._clock()
        if head is not None:
            head = dataclasses.replace(head, until_s=now_s + ttl_s)
        self.heads.publish(pool, owner, head, now_s)

    @property
    def fleet_wide(self) -> bool:
        return self._shared

    async def share_service(
        self, added: list[tuple[str, float, float]], half_life_s: float, now_s: float
    ) -> dict[str, float]:
        mine = self._clock()
        for tenant, amount, at_s in added:
            at_s = mine - (now_s - at_s)  # on this book's clock
            value, since_s = self._service.get(tenant, (0.0, at_s))
            decayed = value * 0.5 ** (max(0.0, at_s - since_s) / half_life_s)
            self._service[tenant] = (max(0.0, decayed + amount), max(at_s, since_s))
        values = {}
        for tenant, (value, since_s) in list(self._service.items()):
            now_value = value * 0.5 ** (max(0.0, mine - since_s) / half_life_s)
            if now_value < 1.0:
                del self._service[tenant]  # decayed to nothing
            else:
                values[tenant] = now_value
        return values

    async def release(self, request_id: str) -> Freed | None:
        return self.ledger.release(request_id)

    async def expire(self, pools: Iterable[str]) -> list[tuple[str, Freed]]:
        return self.ledger.expire(self._clock())

    async def refresh(self, pools: Iterable[str]) -> None:
        return None  # nobody else writes this ledger

    async def observe(
        self, pools: Mapping[str, Pool], kv_cache_usage: Callable[[str], float | None]
    ) -> list[str]:
        now_s = self._clock()
        if now_s - self._observed_s < self._ratio_gap_s:
            return []  # another sidecar sharing this book observed it this interval
        self._observed_s = now_s
        return self.ledger.observe_pools(pools, max(1, self._replicas()), kv_cache_usage)

    def held_by_pool(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        return self.ledger.held_by_pool()

    @property
    def holds(self) -> int:
        return self.ledger.holds

    def handover(self) -> list[Hold]:
        """Every hold, with the time it has left: what the shared ledger adopts."""
        now_s = self._clock()
        return [
            Hold(rid, pool, tokens, sequences, fixed, max(1.0, deadline_s - now_s))
            for rid, (pool, tokens, sequences, fixed, deadline_s) in self.ledger.held_items()
        ]

    def drop(self, request_id: str) -> None:
        """Forget a hold the shared ledger has adopted (it is counted there now)."""
        self.ledger.release(request_id)


class SharedBook(KvBook, Protocol):
    """The fleet's ledger (Redis): a KvBook whose every call may raise LedgerUnavailable,
    and that can take over holds and release ids it has no record of."""

    async def adopt(self, holds: list[Hold]) -> None: ...

    async def release_ids(self, ids: Mapping[str, str]) -> None:
        """Release each id (-> its pool) in the shared ledger, whoever held it."""
        ...

    def forget(self, request_id: str) -> Freed | None:
        """Drop this replica's record of a hold (its release could not reach the ledger)."""
        ...


class FailoverBook:
    """The shared ledger while it answers; a local share of each pool while it does not."""

    def __init__(
        self,
        shared: SharedBook,
        local: LocalBook,
        clock: Callable[[], float],
        retry_interval_s: float = 1.0,
        on_decision: Callable[[bool], None] | None = None,  # called with shared=True/False
    ) -> None:
        self._shared = shared
        self._local = local
        self._on_decision = on_decision
        self._outage = Outage(
            clock, retry_interval_s, log, "shared KV ledger unavailable, admitting on local shares"
        )
        # id -> pool: holds the shared ledger may have (a hold whose reply was lost) or still
        # has (a release that could not reach it); released there once it answers.
        self._unsettled: dict[str, str] = {}

    def capacity(self, spec: Pool) -> PoolCapacity | None:
        return (self._shared if self.healthy else self._local).capacity(spec)

    def view(self, pool: str) -> PoolView:
        return (self._shared if self.healthy else self._local).view(pool)

    @property
    def healthy(self) -> bool:
        return self._outage.up

    async def _recovered(self) -> None:
        """The shared ledger answered after an outage: make its count whole again."""
        if self._unsettled:
            await self._shared.release_ids(dict(self._unsettled))  # twice is harmless
            self._unsettled.clear()
        holds = self._local.handover()
        if holds:
            await self._shared.adopt(holds)
            for hold in holds:
                self._local.drop(hold.request_id)
        log.warning("shared KV ledger is back; %d local holds handed to it", len(holds))
        self._outage.up = True

    async def hold(self, ask: HoldAsk) -> str:
        if self._outage.worth_trying():
            try:
                if not self.healthy:
                    await self._recovered()
                limit = await self._shared.hold(ask)
            except LedgerUnavailable as error:
                self._unsettled[ask.request_id] = ask.pool
                self._outage.failed(error)
            else:
                self._note(True)
                return limit
        # On a local share: this replica alone, nobody else's heads to leave room for.
        limit = await self._local.hold(dataclasses.replace(ask, owner=""))
        self._note(False)
        return limit

    async def publish_head(
        self, pool: str, owner: str, head: HeadOfLine | None, ttl_s: float
    ) -> None:
        if self.healthy:
            try:
                await self._shared.publish_head(pool, owner, head, ttl_s)
            except LedgerUnavailable as error:
                self._outage.failed(error)

    @property
    def fleet_wide(self) -> bool:
        return True

    async def share_service(
        self, added: list[tuple[str, float, float]], half_life_s: float, now_s: float
    ) -> dict[str, float]:
        if self.healthy:
            try:
                return await self._shared.share_service(added, half_life_s, now_s)
            except LedgerUnavailable as error:
                self._outage.failed(error)
        return {}  # alone: this replica's own values stand

    def _note(self, shared: bool) -> None:
        if self._on_decision is not None:
            self._on_decision(shared)

    async def release(self, request_id: str) -> Freed | None:
        freed = await self._local.release(request_id)
        if freed is not None:
            return freed
        try:
            return await self._shared.release(request_id)
        except LedgerUnavailable as error:
            freed = self._shared.forget(request_id)
            if freed is not None:
                self._unsettled[request_id] = freed.pool
            self._outage.failed(error)
            return freed

    async def expire(self, pools: Iterable[str]) -> list[tuple[str, Freed]]:
        pools = list(pools)
        expired = await self._local.expire(pools)
        if self._outage.worth_trying():
            try:
                if not self.healthy:
                    await self._recovered()
                expired += await self._shared.expire(pools)
            except LedgerUnavailable as error:
                self._outage.failed(error)
        return expired

    async def refresh(self, pools: Iterable[str]) -> None:
        if self.healthy:
            try:
                await self._shared.refresh(pools)
            except LedgerUnavailable as error:
                self._outage.failed(error)

    async def observe(
        self, pools: Mapping[str, Pool], kv_cache_usage: Callable[[str], float | None]
    ) -> list[str]:
        if self.healthy:
            try:
                return await self._shared.observe(pools, kv_cache_usage)
            except LedgerUnavailable as error:
                self._outage.failed(error)
        return await self._local.observe(pools, kv_cache_usage)

    def held_by_pool(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        tokens, sequences = (dict(part) for part in self._shared.held_by_pool())
        local_tokens, local_sequences = self._local.held_by_pool()
        for pool, held in local_tokens.items():
            tokens[pool] = tokens.get(pool, 0) + held
        for pool, held in local_sequences.items():
            sequences[pool] = sequences.get(pool, 0) + held
        return tokens, sequences

    @property
    def holds(self) -> int:
        return self._shared.holds + self._local.holds
