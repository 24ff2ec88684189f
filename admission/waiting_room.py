"""The waiting room: requests refused only for capacity wait here, in order, for room.

What lives here: `Waiting` (one waiting request and the waiter its admission awaits),
`WaitNotice` (what a request's admission is told when it enters the room),
`AttainedService` (each tenant's recently attained service, decaying) and `WaitingRoom`
(the queues per pool and tier, their bounds, and the order in which `dispatch` offers the
waiting requests to the KV ledger). Pure: the clock is passed in, and a waiter is anything
with `set_result` / `set_exception` (an asyncio future in the sidecar, the simulator's own
in sim.fleet.sidecar), so the sidecar and the simulator run the same room.

The order, per pool:
- Strict priority between tiers: critical, then standard, then sheddable.
- Fair shares inside a tier: the tenant whose attained service (weighted tokens: prompt +
  output x `output_weight`, decaying with `half_life_s`, divided by its weight) is least
  goes first; FIFO within a tenant (its later requests pass its own blocked one only by
  the backfill rule below, as anyone's do: one tenant's long prompt must not freeze its
  short ones).
- No starvation: the first request in that order that does not fit is the head of the
  line. While it has waited less than `backfill_s`, later requests that fit (smaller ones)
  go ahead of it; once it has waited that long, nothing in its pool passes it until it fits
  — as long as the pool is expected to free what it lacks within `hold_s` (0.5 s) and
  before its deadline, at the rate the pool's requests gave back KV tokens and batch slots
  over the last 10 s. So the pool is held for a large request only when the room is about
  to come, never for seconds: measured in the simulator, holding until the head fitted
  froze the pool for seconds at a time (growth-2x goodput 1100 tokens/s against 1513 with
  the 0.5 s bound; refusing at once: 1515), and holding never left more large critical
  prompts refused (field-mix: 6 against 5). A request that could not fit even an empty
  pool is refused up front, never queued. Small requests are held back by a large one for
  at most `backfill_s` + `hold_s`; a large one is passed only while its room is not about
  to come, and every request leaves by its deadline at the latest (then `queue_timeout`
  with a Retry-After: it is refused, not starved in silence).

Why the ledger and not the engines' metrics decide: the ledger knows each admission and
each end the moment they happen, while a scrape is seconds old; a queue driven by stale
metrics holds requests while the engines sit idle.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from policy.domain import Tier

TIER_ORDER = (Tier.CRITICAL, Tier.STANDARD, Tier.SHEDDABLE)
# A tier's place in that order (0: critical). One numbering for the room and the fleet's
# ledger, which compares a hold's rank with the blocked heads' (admission.kv.capacity.HeadBoard).
RANK = {tier: rank for rank, tier in enumerate(TIER_ORDER)}
# A dispatch pass stops after offering this many requests that did not fit: every end of a
# request starts a pass, and a full room (thousands waiting) must not cost thousands of
# ledger checks per end. Backfill looks this far past the head.
MAX_MISSES = 64


# Told "this request now waits up to N seconds" when it enters the room: the sidecar's
# ext_proc servicer passes one per stream to lift Envoy's message timeout by as much.
WaitNotice = Callable[[float], None]


class Waiter(Protocol):
    """What a waiting admission awaits (asyncio.Future[None] is one)."""

    def done(self) -> bool: ...
    def set_result(self, result: None, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def __await__(self) -> Any: ...


@dataclass(slots=True, eq=False)
class Waiting:
    request_id: str
    pool: str
    tier: Tier
    tenant: str
    tokens: int  # the KV footprint the ledger will hold
    sequences: int
    fixed: bool  # runs to its limit: never discounted by the footprint ratio
    body_bytes: int  # what Envoy holds for it meanwhile
    service: float  # the weighted tokens its tenant attains when it is dispatched
    entered_s: float
    deadline_s: float  # queue_timeout past this
    waiter: Waiter
    order: int = 0  # arrival order, set by the room


class AttainedService:
    """Each tenant's recently attained service: weighted tokens decaying with a half-life."""

    prune_above = 4096  # tenants kept before the ones decayed to nothing are dropped

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self._values: dict[str, tuple[float, float]] = {}  # tenant -> (value, at_s)
        # What was added since the fleet was last told: (tenant, amount, at_s); kept only
        # while `sharing` (replicas share service through the fleet's ledger).
        self.sharing = False
        self.pending: list[tuple[str, float, float]] = []

    def value(self, tenant: str, now_s: float) -> float:
        held = self._values.get(tenant)
        if held is None:
            return 0.0
        value, at_s = held
        return value * 0.5 ** (max(0.0, now_s - at_s) / self.half_life_s)

    def add(self, tenant: str, amount: float, now_s: float) -> None:
        self._values[tenant] = (max(0.0, self.value(tenant, now_s) + amount), now_s)
        if self.sharing:
            self.pending.append((tenant, amount, now_s))
        if len(self._values) > self.prune_above:
            for name in [t for t in self._values if self.value(t, now_s) < 1.0]:
                del self._values[name]

    def take_pending(self) -> list[tuple[str, float, float]]:
        pending, self.pending = self.pending, []
        return pending

    def adopt(self, values: Mapping[str, float], now_s: float) -> None:
        """The fleet's values now (every replica's service, shared through the ledger):
        they replace this replica's, which they include."""
        for tenant, value in values.items():
            self._values[tenant] = (value, now_s)


@dataclass(frozen=True, slots=True)
class RoomBounds:
    max_waiting: int  # per pool and tier
    max_bytes: int  # every waiting body together


class QueueFull(Exception):
    """The room is full for this request: `what` says which bound ("requests", "bytes")."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class Drain:
    """How fast a pool frees room: per second over the last window, its admitted requests'
    ends, the KV tokens and the batch slots they gave back."""

    ends: float
    tokens: float
    sequences: float


@dataclass(slots=True)
class _Rate:
    window_s: float = 10.0
    # (at, tokens, slots, ends): what requests' ends gave back, noted as it was seen
    seen: deque[tuple[float, int, int, int]] = field(default_factory=deque)
    tokens: int = 0
    sequences: int = 0
    ends: int = 0

    def note(self, now_s: float, tokens: int, sequences: int, ends: int = 1) -> None:
        self.seen.append((now_s, tokens, sequences, ends))
        self.tokens += tokens
        self.sequences += sequences
        self.ends += ends
        self._trim(now_s)

    def per_s(self, now_s: float) -> Drain:
        self._trim(now_s)
        w = self.window_s
        return Drain(self.ends / w, self.tokens / w, self.sequences / w)

    def _trim(self, now_s: float) -> None:
        while self.seen and self.seen[0][0] < now_s - self.window_s:
            _, tokens, sequences, ends = self.seen.popleft()
            self.tokens -= tokens
            self.sequences -= sequences
            self.ends -= ends


class WaitingRoom:
    def __init__(self, service: AttainedService) -> None:
        self.service = service
        # (pool, tier) -> tenant -> that tenant's waiting requests, oldest first
        self._queues: dict[tuple[str, Tier], dict[str, deque[Waiting]]] = {}
        self._counts: dict[tuple[str, Tier], int] = {}
        self._by_id: dict[str, Waiting] = {}
        self._rates: dict[str, _Rate] = {}
        self._arrivals = 0
        self.bytes = 0
        # pool -> the request the last dispatch pass held the pool for (nothing passed it)
        self.holding: dict[str, Waiting] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def waiting(self, pool: str, tier: Tier) -> int:
        return self._counts.get((pool, tier), 0)

    def counts(self) -> Mapping[tuple[str, Tier], int]:
        return self._counts

    def pools(self) -> list[str]:
        return sorted({pool for (pool, _), n in self._counts.items() if n})

    def ahead(self, pool: str, tier: Tier) -> int:
        """Requests waiting in `pool` that a new request of `tier` may not pass."""
        return sum(self.waiting(pool, t) for t in TIER_ORDER[: RANK[tier] + 1])

    def enter(self, entry: Waiting, bounds: RoomBounds) -> None:
        """Queue `entry`, or raise QueueFull when a bound would be passed."""
        key = (entry.pool, entry.tier)
        if self._counts.get(key, 0) >= bounds.max_waiting:
            raise QueueFull("requests")
        if self.bytes + entry.body_bytes > bounds.max_bytes:
            raise QueueFull("bytes")
        self._arrivals += 1
        entry.order = self._arrivals
        self._queues.setdefault(key, {}).setdefault(entry.tenant, deque()).append(entry)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._by_id[entry.request_id] = entry
        self.bytes += entry.body_bytes

    def leave(self, request_id: str) -> Waiting | None:
        """Take a request out (dispatched, timed out, or gone); None when it is not here."""
        entry = self._by_id.pop(request_id, None)
        if entry is None:
            return None
        key = (entry.pool, entry.tier)
        tenants = self._queues[key]
        queue = tenants[entry.tenant]
        queue.remove(entry)  # usually the head: dispatch and expiry take the oldest
        if not queue:
            del tenants[entry.tenant]
        self._counts[key] -= 1
        self.bytes -= entry.body_bytes
        return entry

    def expired(self, now_s: float) -> list[Waiting]:
        """Every request past its deadline, taken out."""
        late = [e for e in self._by_id.values() if e.deadline_s <= now_s]
        for entry in late:
            self.leave(entry.request_id)
        return late

    def oldest_wait_s(self, pool: str, now_s: float) -> float:
        """How long the oldest request waiting in `pool` has waited (0: none waits)."""
        entered = [e.entered_s for e in self._by_id.values() if e.pool == pool]
        return now_s - min(entered) if entered else 0.0

    def longest_wait_share(self, pool: str, now_s: float, tiers: Collection[Tier]) -> float:
        """Of the requests of `tiers` waiting in `pool`, the largest part of the wait each
        may take that it has waited (0: none waits; 1: at its deadline)."""
        return max(
            (
                (now_s - e.entered_s) / max(e.deadline_s - e.entered_s, 1e-9)
                for e in self._by_id.values()
                if e.pool == pool and e.tier in tiers
            ),
            default=0.0,
        )

    def note_end(self, pool: str, now_s: float, tokens: int, sequences: int, ends: int = 1) -> None:
        """`ends` admitted requests of `pool` ended (the whole fleet's, with a shared
        ledger), giving back `tokens` and `sequences`: what the drain estimates read."""
        self._rates.setdefault(pool, _Rate()).note(now_s, tokens, sequences, ends)

    def drain(self, pool: str, now_s: float) -> Drain:
        return self._rates.get(pool, _Rate()).per_s(now_s)

    def retry_after_s(self, pool: str, tier: Tier, now_s: float, longest_s: float) -> int:
        """Seconds until the requests a new `tier` request would wait behind have likely
        left, from the rate at which the pool's requests end; at most `longest_s`."""
        rate = self.drain(pool, now_s).ends
        ahead = self.ahead(pool, tier) + 1
        estimate = longest_s if rate <= 0 else ahead / rate
        return max(1, math.ceil(min(estimate, max(longest_s, 1.0))))

    async def dispatch(
        self,
        pool: str,
        fits: Callable[[Waiting], Awaitable[bool]],
        now_s: float,
        backfill_s: float,
        weights: Mapping[str, float],
        room_in_time: Callable[[Waiting], bool] = lambda head: True,
    ) -> list[Waiting]:
        """Offer `pool`'s waiting requests to `fits` (which admits a request into the ledger
        when there is room, and says so) in the room's order; the dispatched ones, taken
        out. Their tenants' attained service grows by each one's service. `room_in_time`:
        whether the pool is expected to free enough for a blocked head before its deadline
        (holding room back for a request that will time out anyway only starves others).
        `fits` may wait (a shared ledger answers over the network); requests that enter or
        leave meanwhile are seen by the next pass, and `fits` gives back what it held for
        one that left."""
        dispatched: list[Waiting] = []
        head: Waiting | None = None
        misses = 0
        self.holding.pop(pool, None)
        for entry in self._in_order(pool, now_s, weights):
            if await fits(entry):
                self.leave(entry.request_id)
                self.service.add(entry.tenant, entry.service, now_s)
                dispatched.append(entry)
                continue
            misses += 1
            if misses > MAX_MISSES:
                break  # a pass is bounded: the next end of a request starts another
            if head is None:
                head = entry
                if now_s - head.entered_s >= backfill_s and room_in_time(head):
                    self.holding[pool] = head
                    break  # the head has waited long enough: nothing passes it any more
        return dispatched

    def _in_order(self, pool: str, now_s: float, weights: Mapping[str, float]) -> Iterator[Waiting]:
        """The waiting requests of `pool` in dispatch order: each tenant's oldest first; a
        tenant whose request is taken comes back ranked by its grown service, one whose
        request is not taken offers its next one (the backfill rule in `dispatch` decides
        whether anything may pass a request that does not fit, inside a tenant too)."""
        for tier in TIER_ORDER:
            tenants = self._queues.get((pool, tier))
            if not tenants:
                continue
            skipped = dict.fromkeys(tenants, 0)  # per tenant: its requests passed over
            heap = [self._rank(t, q[0], now_s, weights) for t, q in tenants.items()]
            heapq.heapify(heap)
            while heap:
                _, _, tenant = heapq.heappop(heap)
                queue = tenants.get(tenant, deque())
                if skipped[tenant] >= len(queue):
                    continue  # its requests left while an offer was answered
                offered = queue[skipped[tenant]]
                yield offered
                queue = tenants.get(tenant, deque())
                index = skipped[tenant]
                if index < len(queue) and queue[index] is offered:
                    skipped[tenant] = index = index + 1  # not taken: its next one
                if index < len(queue):
                    heapq.heappush(heap, self._rank(tenant, queue[index], now_s, weights))

    def _rank(
        self, tenant: str, entry: Waiting, now_s: float, weights: Mapping[str, float]
    ) -> tuple[float, int, str]:
        share = self.service.value(tenant, now_s) / weights.get(tenant, 1.0)
        return (share, entry.order, tenant)
