"""KV admission as a step: hold a request's KV footprint in its pool, waiting for room.

What lives here: `KvStep`. For pools with `kv_capacity_tokens` or `max_num_seqs`, it asks
the ledger (admission.kv.capacity) whether the request's tier may still fill its pool — the
footprint of every completion it may generate, one batch slot each — and holds it until the
request ends; each hold has a deadline (`ttl_s`), past which `expire` frees it if its end
was never seen. Cheap requests (tokenize, the model list) hold nothing.

When the pool is full for now, the request waits in the waiting room (admission.
waiting_room) instead of getting a 503: capacity frees as soon as a request ends, and the
step's room dispatcher (admission.kv.dispatch) offers the room to the ledger on exactly the
events that free it: a settle, a release, an expired hold and a new footprint ratio (the
step tells it), a policy reload and its tick (the process's loops, the simulator's clock).
It is the chain's last step, so a request over its budget or shed by the breaker never
waits: those are refused at once. Past the room's bounds a request gets a 503 with its own
reason — `queue_full` (too many waiting, or too many bytes of waiting bodies) or
`queue_timeout` (its tier's longest wait passed) — and a Retry-After from the room, never a
hang. A request that could not fit even an empty pool is refused at once (`kv_cache_full` /
`sequences_full`): waiting cannot help it. Nor can it help a request whose footprint is
larger than the pool's largest engine's KV cache (two engines of 8k hold 16k between them,
but no 11k request): a 400 (`context_length_exceeded`, reason `engine_kv_exceeded`), the
answer vLLM itself would give, before anything is held.
Where the policy lets requests cross regions, a tolerant request that would get one of
those 503s for want of room (`queue_full`, `kv_cache_full`, `sequences_full`; never
`queue_timeout`: it has waited already) goes to a peer region with room instead
(admission.crossing), holding nothing here. Whatever ends a wait early (the client gone,
Envoy's timer) takes the request out of the room and gives back anything it was just given.
A request holding a large part of its pool (an eighth or more of its tier's share, in KV
or batch slots), admitted where another of its footprint would not fit now or after a
wait, is marked `settle_promptly`: its access-log entry goes out at once, not in the next
batch (tooling.render.envoy_config.filters.access_logs), so what it holds is freed as soon
as it ends — with one engine that holds one 128k prompt at a time, the next one waited
~13 ms for the 20 ms batch (bench/results/overhead-128k.md). Small requests stay batched:
each freed entry costs a gRPC message, and a small hold freed late blocks little.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable

from admission.crossing import Crossing
from admission.decision import QUEUED_HEADER, Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import ContextLengthExceeded, Overloaded
from admission.events import KvEvents
from admission.kv.book import HoldAsk, KvBook, LocalBook
from admission.kv.capacity import Freed, PoolCapacity, kv_footprint, never_fits, pool_capacity
from admission.kv.dispatch import RoomDispatcher
from admission.kv.tier_shares import TierShares
from admission.waiting_room import RANK, QueueFull, RoomBounds, Waiter, Waiting
from policy.domain import Pool, Tier
from policy.schema import Policy


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
        largest_engine: Callable[[Pool], float | None] | None = None,
    ) -> None:
        """`new_waiter` None: no waiting room (a full pool refuses at once). `book`: where
        the ledger lives (None: this process's own, each of `budget.replicas` replicas
        admitting against its part). `wait_cap_s`: no request waits longer, whatever a
        reloaded policy says (Envoy's configured max_message_timeout is written from the
        policy the sidecar started with). `live`: a pool as its serving engines make it,
        the capacity admitted against (a dead or draining engine's room is not there).
        `largest_engine`: the KV cache of the pool's largest serving engine (None: unknown;
        engines.state.EngineFleet.largest_kv_tokens), which no request may exceed."""
        # Where a request its pool and room refuse may cross to another region
        # (admission.crossing); None: no crossing. Set by the assembly.
        self.crossing: Crossing | None = None
        self._live = live or _as_given
        self._largest_engine = largest_engine
        self._events = events
        self._clock = clock
        self._ttl_s = ttl_s
        self._policy = policy
        self._new_waiter = new_waiter
        self._wait_cap_s = wait_cap_s
        self.book: KvBook = book or LocalBook(clock, lambda: policy().budget.replicas)
        # This replica in the fleet's ledger: whose blocked heads of line others leave room
        # for (admission.kv.book).
        self.owner = uuid.uuid4().hex[:12]
        # The share of a pool each tier may fill now (caps ahead of a ramp, loans).
        self.shares = TierShares(lambda: self.dispatcher.room, clock)
        self.dispatcher = RoomDispatcher(
            events=events,
            clock=clock,
            policy=policy,
            book=self.book,
            offer=self._offer,
            owner=self.owner,
            wait_cap_s=wait_cap_s,
            live=self._live,
            share=self.shares.share,
        )

    def _note_wait(self, decision: RoutingDecision, entered_s: float, max_wait_s: float) -> float:
        """How long the request waited; one kept waiting a good part of what it may wait
        calls back what the tiers below it borrowed (admission.kv.tier_shares)."""
        waited_s = self._clock() - entered_s
        # Of the wait it may take, the part it took (refused at once, with no wait: all).
        waited = waited_s / max_wait_s if max_wait_s > 0 else 1.0
        self.shares.note_wait(decision.pool, decision.caller.tier, waited)
        return waited_s

    def _spec(self, policy: Policy, pool: str) -> Pool | None:
        spec = policy.pools.get(pool)
        return None if spec is None else self._live(spec)

    async def admit(self, applicant: Applicant) -> Admitted:
        decision, policy, request_id = applicant.decision, applicant.policy, applicant.request_id
        if not decision.meters_tokens:
            return Admitted(decision)  # one cheap request: no KV, no batch slot
        spec = self._spec(policy, decision.pool)
        if spec is None:
            return Admitted(decision)
        tokens = kv_footprint(decision.reserved_tokens, decision.bucket)
        # A footprint larger than every engine's cache runs nowhere, whatever the pool holds
        # in all (and whether or not it is admitted against): refused before anything is
        # held (the steps before give theirs back).
        largest = (
            self._largest_engine(policy.pools[decision.pool]) if self._largest_engine else None
        )
        if largest is not None and tokens > largest:
            raise _fits_no_engine(decision, tokens, largest)
        capacity = self.book.capacity(spec)
        if capacity is None:
            return Admitted(decision)
        tier = decision.caller.tier
        share = self._in_pieces(policy, spec, tier, tokens, decision.sequences)
        now_s = self._clock()
        service = self._service(decision, policy)
        room = self.dispatcher.room
        limit = ""
        if not room.ahead(decision.pool, tier):
            limit = await self._hold(
                request_id,
                spec,
                tier,
                tokens,
                decision.sequences,
                decision.runs_to_limit,
                share=share,
            )
            self.dispatcher.drain_from(decision.pool)
            if not limit:
                room.service.add(decision.caller.tenant, service, now_s)
                if _large(capacity, share, tokens, decision.sequences) and self.book.view(
                    decision.pool
                ).over(capacity, share, tokens, decision.sequences, decision.runs_to_limit):
                    decision = dataclasses.replace(decision, settle_promptly=True)
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
            if not never:  # refused for room it could have had: as if it waited it all
                crossed = self._cross(applicant, decision)
                if crossed is not None:
                    return Admitted(crossed)
                self._note_wait(decision, now_s, 0.0)
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
        bounds = policy.waiting_room
        try:
            room.enter(entry, RoomBounds(bounds.max_waiting, bounds.max_waiting_bytes))
        except QueueFull as full:
            crossed = self._cross(applicant, decision)
            if crossed is not None:
                return Admitted(crossed)
            self._events.waited(tier.value, "full", 0.0)
            raise self._queue_full(decision, full.what, now_s, policy) from None
        await self.dispatcher.dispatch(decision.pool)  # it may already fit in its turn
        if applicant.on_wait is not None and not entry.waiter.done():
            applicant.on_wait(max_wait_s)
        try:
            await entry.waiter
        except BaseException as error:
            self._note_wait(decision, now_s, max_wait_s)
            if room.leave(request_id) is not None:  # gone while waiting
                self._events.waited(tier.value, "cancelled", self._clock() - now_s)
            elif not isinstance(error, Overloaded):
                await self._freed(await self.book.release(request_id))  # dispatched, then gone
            raise
        waited_s = self._note_wait(decision, now_s, max_wait_s)
        prompt = _large(capacity, share, tokens, decision.sequences)
        decision = dataclasses.replace(decision, waited_s=waited_s, settle_promptly=prompt)
        return Admitted(decision, {QUEUED_HEADER: str(round(waited_s * 1000))})

    def _cross(self, applicant: Applicant, decision: RoutingDecision) -> RoutingDecision | None:
        """The request re-routed to a peer region with room instead of the 503 its full
        pool and room would give it (admission.crossing); None: it is refused here."""
        if self.crossing is None:
            return None
        if decision.level >= applicant.policy.regions.crossing.from_level:
            return None  # the breaker step asked at this level already: the same answer
        asked = dataclasses.replace(applicant, decision=decision)
        return self.crossing.reroute(asked, int(decision.level), waiting_full=True)

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

    def _in_pieces(
        self, policy: Policy, spec: Pool, tier: Tier, tokens: int, sequences: int
    ) -> float:
        """`tier`'s share of the pool for a request of `tokens` and `sequences`: a loan is
        lent in small pieces. A request holding an eighth or more of its tier's own share
        is admitted against that share: a large footprint times the footprint ratio's
        error is what ran a lent pool out of memory (measured on mix-1k-128k, seed 7: one
        OOM with the loan, none without it or with this)."""
        share = self.shares.share(policy, spec.name, tier)
        base = policy.breaker.kv_shares[tier]
        capacity = self.book.capacity(spec)
        if share > base and capacity is not None and _large(capacity, base, tokens, sequences):
            return base
        return share

    async def _offer(self, entry: Waiting, spec: Pool, share: float) -> str:
        """A waiting request, offered from the room (admission.kv.dispatch)."""
        if share > self._policy().breaker.kv_shares[entry.tier]:
            share = self._in_pieces(self._policy(), spec, entry.tier, entry.tokens, entry.sequences)
        return await self._hold(
            entry.request_id,
            spec,
            entry.tier,
            entry.tokens,
            entry.sequences,
            entry.fixed,
            share,
            offer=True,
        )

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
            retry_after_s=self.dispatcher.retry_after_s(decision.pool, tier, now_s, policy),
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
        service = self.dispatcher.room.service
        decay = 0.5 ** (outcome.duration_s / service.half_life_s)
        correction = (generated - charged) * policy.waiting_room.output_weight * decay
        if correction:
            service.add(decision.caller.tenant, correction, self._clock())

    async def _freed(self, freed: Freed | None) -> None:
        if freed is not None:
            await self.dispatcher.freed(freed.pool)

    async def expire(self) -> list[str]:
        """Free the holds past their deadline; their ids."""
        limited = [n for n, p in self._policy().pools.items() if pool_capacity(p) is not None]
        expired = await self.book.expire(limited)
        for _, freed in expired:
            await self._freed(freed)
        return [request_id for request_id, _ in expired]

    async def observe(self, policy: Policy, kv_cache_usage: Callable[[str], float | None]) -> None:
        """Each controller interval: learn each pool's real-to-counted KV ratio (a lower
        ratio makes room: the waiting requests are offered it)."""
        pools = {name: self._live(spec) for name, spec in policy.pools.items()}
        for name in await self.book.observe(pools, kv_cache_usage):
            self._events.footprint_ratio(name, self.book.view(name).ratio)
        await self.dispatcher.dispatch()


# The tiers above each borrower, the one right above it last.
def _as_given(spec: Pool) -> Pool:
    return spec


def _fits_no_engine(
    decision: RoutingDecision, tokens: int, largest: float
) -> ContextLengthExceeded:
    """A 400, as vLLM's own answer would be: neither a retry nor a wait can help it."""
    return ContextLengthExceeded(
        f"This request's context ({decision.context_tokens} tokens: its prompt and "
        f"max_tokens) needs {tokens} tokens of KV cache, more than any engine of the "
        f"{decision.pool!r} pool holds (the largest: {math.floor(largest)} tokens); no engine "
        "can run it, however long it waits. Lower max_tokens or shorten the prompt.",
        reason="engine_kv_exceeded",
    )


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


def _large(capacity: PoolCapacity, share: float, tokens: int, sequences: int) -> bool:
    """Whether a footprint is an eighth or more of the tier's share of the pool, in KV or
    in batch slots (what is worth an access-log message of its own to free on time)."""
    kv, slots = capacity.kv_tokens, capacity.sequences
    return (kv is not None and tokens * 8 >= kv * share) or (
        slots is not None and sequences * 8 >= slots * share
    )
