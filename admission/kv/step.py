"""KV admission as a step: hold a request's KV footprint in its pool, waiting for room.

What lives here: `KvStep`. For pools with `kv_capacity_tokens` or `max_num_seqs`, it asks
the ledger (admission.kv.capacity) whether the request's tier may still fill its pool — the
footprint of every completion it may generate, one batch slot each — and holds it until the
request ends; each hold has a deadline (`ttl_s`), past which `expire` frees it if its end
was never seen. Cheap requests (tokenize, the model list) hold nothing.

When the pool is full for now, the request waits in the waiting room (admission.
waiting_room) instead of getting a 503: capacity frees as soon as a request ends, and the
step dispatches the room on exactly the events that free it (a settle, a release, an
expired hold, a new footprint ratio, a policy reload, and `tick`). It is the chain's last
step, so a request over its budget or shed by the breaker never waits: those are refused
at once. Past the room's bounds a request gets a 503 with its own reason — `queue_full`
(too many waiting, or too many bytes of waiting bodies) or `queue_timeout` (its tier's
longest wait passed) — and a Retry-After from the room, never a hang. A request that could
not fit even an empty pool is refused at once (`kv_cache_full` / `sequences_full`): waiting
cannot help it. Whatever ends a wait early (the client gone, Envoy's timer) takes the
request out of the room and gives back anything it was just given.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable

from admission.decision import QUEUED_HEADER, Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import Overloaded
from admission.events import KvEvents
from admission.kv.book import HoldAsk, KvBook, LocalBook
from admission.kv.capacity import (
    Freed,
    HeadOfLine,
    KvLedger,
    PoolCapacity,
    PoolView,
    kv_footprint,
    never_fits,
    pool_capacity,
)
from admission.waiting_room import (
    RANK,
    AttainedService,
    QueueFull,
    RoomBounds,
    Waiter,
    Waiting,
    WaitingRoom,
)
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


class KvStep:
    def __init__(
        self,
        events: KvEvents,
        clock: Callable[[], float],
        ttl_s: float,
        policy: Callable[[], Policy],
        new_waiter: Callable[[], Waiter] | None = None,
        book: KvBook | None = None,
        wait_cap_s: float = math.inf,
        live: Callable[[Pool], Pool] | None = None,
    ) -> None:
        """`new_waiter` None: no waiting room (a full pool refuses at once). `book`: where
        the ledger lives (None: this process's own, each of `budget.replicas` replicas
        admitting against its part). `wait_cap_s`: no request waits longer, whatever a
        reloaded policy says (Envoy's configured max_message_timeout is written from the
        policy the sidecar started with). `live`: a pool as its serving engines make it,
        the capacity admitted against (a dead or draining engine's room is not there)."""
        self._live = live or _as_given
        self._events = events
        self._clock = clock
        self._ttl_s = ttl_s
        self._policy = policy
        self._new_waiter = new_waiter
        self._wait_cap_s = wait_cap_s
        self.book: KvBook = book or LocalBook(clock, lambda: policy().budget.replicas)
        self.room = WaitingRoom(AttainedService(policy().waiting_room.half_life_s))
        # One dispatch pass at a time: a shared ledger answers over the network, and a pass
        # asked for meanwhile runs right after the one in progress (None: every pool).
        self._dispatching = False
        self._again: set[str | None] = set()
        # This replica in the fleet's ledger: whose blocked heads of line others leave room
        # for (admission.kv.book), and the pools it has published one in.
        self.owner = uuid.uuid4().hex[:12]
        self._published: set[str] = set()
        # pool -> the ledger's count of what ends gave back, when last noted for the drain
        self._drained: dict[str, tuple[int, int, int]] = {}
        self._service_synced_s = -math.inf
        self.room.service.sharing = self.book.fleet_wide

    def _spec(self, policy: Policy, pool: str) -> Pool | None:
        spec = policy.pools.get(pool)
        return None if spec is None else self._live(spec)

    async def admit(self, applicant: Applicant) -> Admitted:
        decision, policy, request_id = applicant.decision, applicant.policy, applicant.request_id
        if not decision.meters_tokens:
            return Admitted(decision)  # one cheap request: no KV, no batch slot
        spec = self._spec(policy, decision.pool)
        capacity = None if spec is None else self.book.capacity(spec)
        if spec is None or capacity is None:
            return Admitted(decision)
        tier = decision.caller.tier
        share = policy.breaker.kv_shares[tier]
        tokens = kv_footprint(decision.reserved_tokens, decision.bucket)
        now_s = self._clock()
        service = self._service(decision, policy)
        limit = ""
        if not self.room.ahead(decision.pool, tier):
            limit = await self._hold(
                request_id,
                spec,
                tier,
                tokens,
                decision.sequences,
                decision.runs_to_limit,
                share=share,
            )
            if decision.pool not in self._drained:  # the count the drain is noted from
                view = self.book.view(decision.pool)
                self._drained[decision.pool] = (view.freed_tokens, view.freed_sequences, view.ends)
            if not limit:
                self.room.service.add(decision.caller.tenant, service, now_s)
                return Admitted(decision)
        # Full for now, or others wait ahead of it: it waits too, in its turn.
        ratio = self.book.view(decision.pool).ratio
        never = never_fits(
            ratio, tokens, capacity, share, decision.sequences, decision.runs_to_limit
        )
        d = decision  # its tenant's TTFT objective, where set, bounds its wait
        wait_s = policy.max_wait_s(tier, d.pool, d.bucket.name, d.prompt_tokens, d.caller.tenant)
        max_wait_s = min(self._wait_cap_s, wait_s)
        if never or self._new_waiter is None or max_wait_s <= 0:
            raise _pool_full(decision, never or limit)
        entry = Waiting(
            request_id=request_id,
            pool=decision.pool,
            tier=tier,
            tenant=decision.caller.tenant,
            tokens=tokens,
            sequences=decision.sequences,
            fixed=decision.runs_to_limit,
            body_bytes=decision.body_bytes,
            service=service,
            entered_s=now_s,
            deadline_s=now_s + max_wait_s,
            waiter=self._new_waiter(),
        )
        room = policy.waiting_room
        try:
            self.room.enter(entry, RoomBounds(room.max_waiting, room.max_waiting_bytes))
        except QueueFull as full:
            self._events.waited(tier.value, "full", 0.0)
            raise self._queue_full(decision, full.what, now_s, policy) from None
        await self.dispatch(decision.pool)  # it may already fit in its turn
        if applicant.on_wait is not None and not entry.waiter.done():
            applicant.on_wait(max_wait_s)
        try:
            await entry.waiter
        except BaseException as error:
            if self.room.leave(request_id) is not None:  # gone while waiting
                self._events.waited(tier.value, "cancelled", self._clock() - now_s)
            elif not isinstance(error, Overloaded):
                await self._freed(await self.book.release(request_id))  # dispatched, then gone
            raise
        waited_s = self._clock() - now_s
        decision = dataclasses.replace(decision, waited_s=waited_s)
        return Admitted(decision, {QUEUED_HEADER: str(round(waited_s * 1000))})

    async def _hold(
        self,
        request_id: str,
        spec: Pool,
        tier: Tier,
        tokens: int,
        sequences: int,
        fixed: bool,
        share: float,
        offer: bool = False,
    ) -> str:
        """Hold the footprint in `spec`'s pool now if it fits: "" when held, else what is
        full. The one way a request is put in the ledger, on arrival or offered from the
        room (`offer`: a shared ledger may answer "full" from what it read a moment ago).
        `share`: the tier's KV share under the policy the caller holds (the request's own
        snapshot on arrival; the current one when the room dispatches)."""
        ask = HoldAsk(
            request_id,
            spec.name,
            spec,
            tokens,
            share,
            self._ttl_s,
            sequences,
            fixed,
            trust_view=offer,
            owner=self.owner,
            rank=RANK[tier],
        )
        return await self.book.hold(ask)

    def _service(self, decision: RoutingDecision, policy: Policy) -> float:
        """The weighted tokens a request attains: its prompt, and its output limit x the
        output weight (corrected by the real output when it is settled)."""
        output = decision.sequences * decision.max_tokens
        return decision.prompt_tokens + output * policy.waiting_room.output_weight

    def _queue_full(
        self, decision: RoutingDecision, what: str, now_s: float, policy: Policy
    ) -> Overloaded:
        tier = decision.caller.tier
        detail = (
            "too many requests are waiting"
            if what == "requests"
            else "the waiting requests' bodies fill the memory set aside for them"
        )
        return Overloaded(
            f"The {decision.pool!r} pool is full at the {tier.value} tier and {detail}. "
            "Please retry later.",
            reason="queue_full",
            retry_after_s=self._retry_after(decision.pool, tier, now_s, policy),
        )

    def _retry_after(self, pool: str, tier: Tier, now_s: float, policy: Policy) -> int:
        longest = policy.waiting_room.max_wait_s.get(tier) or policy.longest_wait_s
        return self.room.retry_after_s(pool, tier, now_s, min(longest, self._wait_cap_s))

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
        shares = policy.breaker.kv_shares
        dispatched = 0
        for name in [pool] if pool is not None else self.room.pools():
            spec = self._spec(policy, name) or Pool(name=name, endpoints=())
            capacity = self.book.capacity(spec) or PoolCapacity(None, None)

            async def fits(entry: Waiting, spec: Pool = spec) -> bool:
                held = await self._hold(
                    entry.request_id,
                    spec,
                    entry.tier,
                    entry.tokens,
                    entry.sequences,
                    entry.fixed,
                    shares[entry.tier],
                    offer=True,
                )
                if not held and entry.request_id not in self.room:
                    # It left (gone, timed out) while the ledger answered: give it back.
                    await self.book.release(entry.request_id)
                    return False
                return not held

            def in_time(head: Waiting, capacity: PoolCapacity = capacity) -> bool:
                return self._room_in_time(head, capacity, shares[head.tier], now_s, room.hold_s)

            for entry in await self.room.dispatch(
                name, fits, now_s, room.backfill_s, room.tenant_weights, in_time
            ):
                dispatched += 1
                self._events.waited(entry.tier.value, "dispatched", now_s - entry.entered_s)
                if not entry.waiter.done():
                    entry.waiter.set_result(None)
        return dispatched

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
            await self.book.refresh(pools)
            for pool in pools:
                self._note_drain(pool)
        await self.dispatch()
        await self._publish_heads()
        if self.book.fleet_wide and now_s - self._service_synced_s >= SERVICE_SYNC_S:
            await self._share_service(now_s)

    async def _share_service(self, now_s: float) -> None:
        """Fair shares across the fleet: this replica's tenants' attained service goes to
        the shared ledger, and the fleet's comes back (one round trip a second)."""
        self._service_synced_s = now_s
        service = self.room.service
        added = service.take_pending()
        try:
            values = await self.book.share_service(added, service.half_life_s, now_s)
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
                    await self.book.publish_head(pool, self.owner, None, HEAD_TTL_S)
                    self._published.discard(pool)
                continue
            expected = PoolView(ratio=self.book.view(pool).ratio).expected(head.tokens, head.fixed)
            published = HeadOfLine(head.request_id, RANK[head.tier], expected, head.sequences)
            await self.book.publish_head(pool, self.owner, published, HEAD_TTL_S)
            self._published.add(pool)

    def _timed_out(self, entry: Waiting, now_s: float) -> Overloaded:
        return Overloaded(
            f"The {entry.pool!r} pool stayed full at the {entry.tier.value} tier for the "
            f"longest this request may wait ({now_s - entry.entered_s:.1f} s). "
            "Please retry later.",
            reason="queue_timeout",
            retry_after_s=self._retry_after(entry.pool, entry.tier, now_s, self._policy()),
        )

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        await self._freed(await self.book.release(request_id))

    async def settle(self, outcome: RequestOutcome) -> None:
        """The request ended (or expired): its footprint is free again, and its tenant's
        attained service is corrected to what it really generated."""
        await self._freed(await self.book.release(outcome.tracking_id))
        decision = outcome.decision
        if not decision.meters_tokens:
            return
        policy = self._policy()
        charged = decision.sequences * decision.max_tokens
        generated = outcome.completion_tokens or 0
        decay = 0.5 ** (outcome.duration_s / self.room.service.half_life_s)
        correction = (generated - charged) * policy.waiting_room.output_weight * decay
        if correction:
            self.room.service.add(decision.caller.tenant, correction, self._clock())

    async def _freed(self, freed: Freed | None) -> None:
        if freed is not None:
            self._note_drain(freed.pool)
            await self.dispatch(freed.pool)

    def _note_drain(self, pool: str) -> None:
        """What the pool's requests gave back since last noted — the whole fleet's, with a
        shared ledger: a replica taking a tenth of the traffic sees a tenth of the ends,
        and would judge every blocked head's room too far away."""
        view = self.book.view(pool)
        now = (view.freed_tokens, view.freed_sequences, view.ends)
        before = self._drained.get(pool)
        self._drained[pool] = now
        if before is not None and now[2] > before[2]:
            self.room.note_end(
                pool, self._clock(), now[0] - before[0], now[1] - before[1], now[2] - before[2]
            )

    async def expire(self) -> list[str]:
        """Free the holds past their deadline; their ids."""
        limited = [n for n, p in self._policy().pools.items() if pool_capacity(p) is not None]
        expired = await self.book.expire(limited)
        for _, freed in expired:
            await self._freed(freed)
        return [request_id for request_id, _ in expired]

    def _room_in_time(
        self, head: Waiting, capacity: PoolCapacity, share: float, now_s: float, hold_s: float
    ) -> bool:
        """Whether `head`'s pool is expected to free what it lacks within `hold_s` and
        before its deadline, at the rate the pool's requests have been giving room back."""
        left_s = min(head.deadline_s - now_s, hold_s)
        drain = self.room.drain(head.pool, now_s)
        view = self.book.view(head.pool)
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

    async def observe(self, policy: Policy, kv_cache_usage: Callable[[str], float | None]) -> None:
        """Each controller interval: learn each pool's real-to-counted KV ratio (a lower
        ratio makes room: the waiting requests are offered it)."""
        pools = {name: self._live(spec) for name, spec in policy.pools.items()}
        for name in await self.book.observe(pools, kv_cache_usage):
            self._events.footprint_ratio(name, self.book.view(name).ratio)
        await self.dispatch()


def _as_given(spec: Pool) -> Pool:
    return spec


def _pool_full(decision: RoutingDecision, limit: str) -> Overloaded:
    tier = decision.caller.tier.value
    if limit == "sequences":
        return Overloaded(
            f"The {decision.pool!r} pool runs as many requests as it may at the {tier} tier "
            f"right now. Please retry shortly.",
            reason="sequences_full",
            retry_after_s=1,
        )
    return Overloaded(
        f"The {decision.pool!r} pool has no KV-cache room for this request's context "
        f"({decision.context_tokens} tokens) at the {tier} tier right now. Please "
        f"retry shortly, or lower max_tokens.",
        reason="kv_cache_full",
        retry_after_s=1,
    )
