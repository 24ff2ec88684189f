"""The waiting room's dispatch: offer the requests waiting for a pool's room to its ledger.

What lives here: `RoomDispatcher`, which owns a replica's waiting room (admission.
waiting_room) and drives it against the KV ledger (admission.kv.book). The KV step
(admission.kv.step) puts a request in the room when its pool is full for now, and calls
`freed` on exactly the events that free room (a settle, a release, an expired hold) and
`dispatch` on a new footprint ratio; the process's wiring calls `dispatch` on a policy
reload and `tick` every ROOM_TICK_S. Each pass offers the room's requests in its order
(`fits`: the step holds the footprint, trusting the ledger's last view) and holds the pool
for a blocked head of line only while its room is about to come (`in_time`: the rate at
which the pool's ends gave room back, the whole fleet's with a shared ledger). The tick
also times waits out, tells the fleet's ledger this replica's blocked heads (so other
replicas leave their room free) and shares its tenants' attained service with the fleet.
Pure: the clock is passed in, and the ledger is whatever book it is given. Its tests go
through the KV step, as the sidecar uses it: tests/admission/test_waiting_room.py.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from admission.errors import Overloaded
from admission.events import KvEvents
from admission.kv.book import KvBook
from admission.kv.capacity import HeadOfLine, KvLedger, PoolCapacity, PoolView
from admission.waiting_room import RANK, AttainedService, Waiting, WaitingRoom
from policy.domain import Pool, Tier
from policy.schema import Policy

# How often the sidecar runs `tick` (and the simulator, on its clock): waits past their
# deadline leave the room within this; dispatch itself runs on every event that frees room.
ROOM_TICK_S = 0.05
# A blocked head of line published to the fleet's ledger is forgotten this long after its
# replica last published it (a replica that died takes its heads with it within this).
HEAD_TTL_S = 0.25
# How often a replica shares its tenants' attained service with the fleet's ledger: the
# fairness order sees other replicas' service at most this late.
SERVICE_SYNC_S = 1.0

# Hold a waiting request's footprint in the pool (`spec`) at its tier's share: "" when held,
# else what is full. The KV step's hold: the one way a request is put in the ledger.
Offer = Callable[[Waiting, Pool, float], Awaitable[str]]


class RoomDispatcher:
    def __init__(
        self,
        *,
        events: KvEvents,
        clock: Callable[[], float],
        policy: Callable[[], Policy],
        book: KvBook,
        offer: Offer,
        owner: str,
        wait_cap_s: float,
        live: Callable[[Pool], Pool],
        share: Callable[[Policy, str, Tier], float] | None = None,
    ) -> None:
        """`offer`: the KV step's hold. `owner`: this replica in the fleet's ledger, whose
        blocked heads it publishes (the step holds as the same owner, so this replica's
        admissions never leave room free for its own heads). `wait_cap_s`: no request waits
        longer, whatever a reloaded policy says (it bounds the Retry-After too). `live`: a
        pool as its serving engines make it. `share(policy, pool, tier)`: the share of the
        pool a tier may fill now (None: the policy's `kv_shares`)."""
        self._events = events
        self._clock = clock
        self._policy = policy
        self._book = book
        self._offer = offer
        self._owner = owner
        self._wait_cap_s = wait_cap_s
        self._live = live
        self._share = share or _policy_share
        self.room = WaitingRoom(AttainedService(policy().waiting_room.half_life_s))
        self.room.service.sharing = book.fleet_wide
        # One dispatch pass at a time: a shared ledger answers over the network, and a pass
        # asked for meanwhile runs right after the one in progress (None: every pool).
        self._dispatching = False
        self._again: set[str | None] = set()
        # the pools this replica has published a blocked head of line in (admission.kv.book)
        self._published: set[str] = set()
        # pool -> the ledger's count of what ends gave back, when last noted for the drain
        self._drained: dict[str, tuple[int, int, int]] = {}
        self._service_synced_s = -math.inf

    async def dispatch(self, pool: str | None = None) -> int:
        """Offer the waiting requests of `pool` (None: every pool) to the ledger, in the
        room's order; the number dispatched."""
        if self._dispatching:
            self._again.add(pool)
            return 0
        self._dispatching = True
        try:
            dispatched = await self._dispatch(pool)
            while self._again:
                again, self._again = self._again, set()
                for name in [None] if None in again else sorted(p for p in again if p):
                    dispatched += await self._dispatch(name)
            return dispatched
        finally:
            self._dispatching = False

    async def _dispatch(self, pool: str | None) -> int:
        if not len(self.room):
            return 0
        policy = self._policy()
        now_s = self._clock()
        room = policy.waiting_room
        dispatched = 0
        for name in [pool] if pool is not None else self.room.pools():
            shares = {tier: self._share(policy, name, tier) for tier in Tier}
            spec = policy.pools.get(name)
            spec = Pool(name=name, endpoints=()) if spec is None else self._live(spec)
            capacity = self._book.capacity(spec) or PoolCapacity(None, None)

            async def fits(
                entry: Waiting, spec: Pool = spec, shares: dict[Tier, float] = shares
            ) -> bool:
                held = await self._offer(entry, spec, shares[entry.tier])
                if not held and entry.request_id not in self.room:
                    # It left (gone, timed out) while the ledger answered: give it back.
                    await self._book.release(entry.request_id)
                    return False
                return not held

            def in_time(
                head: Waiting,
                capacity: PoolCapacity = capacity,
                shares: dict[Tier, float] = shares,
            ) -> bool:
                return self._room_in_time(head, capacity, shares[head.tier], now_s, room.hold_s)

            for entry in await self.room.dispatch(
                name, fits, now_s, room.backfill_s, room.tenant_weights, in_time
            ):
                dispatched += 1
                self._events.waited(entry.tier.value, "dispatched", now_s - entry.entered_s)
                if not entry.waiter.done():
                    entry.waiter.set_result(None)
        return dispatched

    async def freed(self, pool: str) -> None:
        """A request's end gave `pool` room back: noted for the drain, and offered."""
        self._note_drain(pool)
        await self.dispatch(pool)

    async def tick(self) -> None:
        """Time out the waits past their deadline, read the pools others may have freed
        room in (a shared ledger), then dispatch every pool (a timer behind the events, for
        what no event announces: another replica's ends, a reloaded capacity)."""
        now_s = self._clock()
        for entry in self.room.expired(now_s):
            self._events.waited(entry.tier.value, "timed_out", now_s - entry.entered_s)
            if not entry.waiter.done():
                entry.waiter.set_exception(self._timed_out(entry, now_s))
        pools = self.room.pools()
        if pools:
            await self._book.refresh(pools)
            for pool in pools:
                self._note_drain(pool)
        await self.dispatch()
        await self._publish_heads()
        if self._book.fleet_wide and now_s - self._service_synced_s >= SERVICE_SYNC_S:
            await self._share_service(now_s)

    async def _share_service(self, now_s: float) -> None:
        """Fair shares across the fleet: this replica's tenants' attained service goes to
        the shared ledger, and the fleet's comes back (one round trip a second)."""
        self._service_synced_s = now_s
        service = self.room.service
        added = service.take_pending()
        try:
            values = await self._book.share_service(added, service.half_life_s, now_s)
        except BaseException:
            service.pending[:0] = added  # told next time
            raise
        service.adopt(values, now_s)

    async def _publish_heads(self) -> None:
        """Tell the fleet's ledger which request each pool is held for here (the room's
        blocked head of line), or that none is any more."""
        for pool in sorted(set(self.room.holding) | self._published):
            head = self.room.holding.get(pool)
            if head is None or head.request_id not in self.room:
                if pool in self._published:
                    await self._book.publish_head(pool, self._owner, None, HEAD_TTL_S)
                    self._published.discard(pool)
                continue
            expected = PoolView(ratio=self._book.view(pool).ratio).expected(head.tokens, head.fixed)
            published = HeadOfLine(head.request_id, RANK[head.tier], expected, head.sequences)
            await self._book.publish_head(pool, self._owner, published, HEAD_TTL_S)
            self._published.add(pool)

    def _timed_out(self, entry: Waiting, now_s: float) -> Overloaded:
        return Overloaded(
            f"The {entry.pool!r} pool stayed full at the {entry.tier.value} tier for the "
            f"longest this request may wait ({now_s - entry.entered_s:.1f} s). "
            "Please retry later.",
            reason="queue_timeout",
            retry_after_s=self.retry_after_s(entry.pool, entry.tier, now_s, self._policy()),
        )

    def retry_after_s(self, pool: str, tier: Tier, now_s: float, policy: Policy) -> int:
        """The Retry-After of a request of `tier` refused for `pool`'s room (its wait over,
        or the room full)."""
        longest = policy.waiting_room.max_wait_s.get(tier) or policy.longest_wait_s
        return self.room.retry_after_s(pool, tier, now_s, min(longest, self._wait_cap_s))

    def drain_from(self, pool: str) -> None:
        """Count `pool`'s ends for the drain from the ledger's count now, on this replica's
        first admission there: the ledger's total since it began (the fleet's, when shared)
        is no drain of this moment, and the first end after it counts."""
        if pool not in self._drained:
            view = self._book.view(pool)
            self._drained[pool] = (view.freed_tokens, view.freed_sequences, view.ends)

    def _note_drain(self, pool: str) -> None:
        """What the pool's requests gave back since last noted — the whole fleet's, with a
        shared ledger: a replica taking a tenth of the traffic sees a tenth of the ends,
        and would judge every blocked head's room too far away."""
        view = self._book.view(pool)
        now = (view.freed_tokens, view.freed_sequences, view.ends)
        before = self._drained.get(pool)
        self._drained[pool] = now
        if before is not None and now[2] > before[2]:
            self.room.note_end(
                pool, self._clock(), now[0] - before[0], now[1] - before[1], now[2] - before[2]
            )

    def _room_in_time(
        self, head: Waiting, capacity: PoolCapacity, share: float, now_s: float, hold_s: float
    ) -> bool:
        """Whether `head`'s pool is expected to free what it lacks within `hold_s` and
        before its deadline, at the rate the pool's requests have been giving room back."""
        left_s = min(head.deadline_s - now_s, hold_s)
        drain = self.room.drain(head.pool, now_s)
        view = self._book.view(head.pool)
        needed_s = 0.0
        if capacity.kv_tokens is not None:
            expected = view.expected(head.tokens, head.fixed)
            ratio = max(view.ratio, KvLedger.min_ratio)
            short = (expected - capacity.kv_tokens * share) / ratio  # in counted tokens
            if short > 0:
                needed_s = math.inf if drain.tokens <= 0 else short / drain.tokens
        if capacity.sequences is not None:
            short = view.sequences + head.sequences - capacity.sequences * share
            if short > 0:
                wait_s = math.inf if drain.sequences <= 0 else short / drain.sequences
                needed_s = max(needed_s, wait_s)
        return needed_s <= left_s


def _policy_share(policy: Policy, pool: str, tier: Tier) -> float:
    return policy.breaker.kv_shares[tier]
