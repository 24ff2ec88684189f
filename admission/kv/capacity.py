"""KV-cache admission: each pool's KV capacity, shared out by tier, against what is in flight.

What lives here: `kv_footprint` (the cache a request can hold: its whole context, prompt +
max_tokens, times its bucket's KV weight) and `KvLedger`, which counts the footprints and
the number of the requests this sidecar admitted and has not yet seen finish, per pool:
an engine runs out of KV cache with long contexts and out of batch slots (vLLM's
max_num_seqs) with many short ones, and either way the next request waits in its queue.
Pure: no clock, no I/O; the sidecar and the offline simulator call the same methods.

Why: the breaker and the quota controller read the engines through a metrics scrape, seconds
late, and a 10x burst fills a KV cache in less. The ledger knows each admission the moment
it happens. A tier may fill its pool (cache and slots) up to its share (default: critical
100%, standard 95%, sheddable 85%), so the last 5-15% stays free for the tiers above it,
and a burst meets a refusal here (503, retry in 1 s) rather than an OOM or a queue in the
engine.

The footprint is an upper bound on the generated part: the engine holds the prompt plus the
tokens generated so far, not max_tokens from the start, and clients often send max_tokens
far above what they get back (4096 for a 200-token answer counts 3-5x too much). So the
ledger learns, per pool, the ratio of what the engine reports holding (its scraped KV
usage) to what it counted, and admits against counted x ratio: up at once when the engine
is fuller than thought, down slowly. The ratio may rise above 1.0 (up to `max_ratio`) when
the engine holds more than was counted (prompts counted low, say) for `sustain` readings in
a row: above 1.0 it follows the smallest of them, since a single reading can be high only
because requests ended between the scrape and the count. Requests that run to their limit
(ignore_eos, min_tokens) are never discounted below their count. Each admission is still
counted the moment it happens; only the conversion to real cache is learned.

Where the ledger lives is admission.kv.book's concern: this one is a process's own (one
sidecar, or a replica's local share while the fleet's shared ledger cannot be reached).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from policy.domain import ContextBucket, Pool


def kv_footprint(context_tokens: int, bucket: ContextBucket) -> int:
    return math.ceil(context_tokens * bucket.kv_weight)


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """What one sidecar may fill of a pool (its part, with several replicas); None: unknown,
    not limited."""

    kv_tokens: float | None  # the engines' KV cache
    sequences: float | None  # the engines' batch slots (vLLM max_num_seqs, summed)


def pool_capacity(pool: Pool, replicas: int = 1) -> PoolCapacity | None:
    """One sidecar's part of what the policy says the pool holds; None: no admission."""
    if pool.kv_capacity_tokens is None and pool.max_num_seqs is None:
        return None
    return PoolCapacity(
        None if pool.kv_capacity_tokens is None else pool.kv_capacity_tokens / replicas,
        None if pool.max_num_seqs is None else pool.max_num_seqs / replicas,
    )


class Freed(NamedTuple):
    """What a released request gave back."""

    pool: str
    tokens: int
    sequences: int


@dataclass(frozen=True, slots=True)
class HeadOfLine:
    """A replica's blocked head of line in a pool: the request its waiting room holds the
    pool for (admission.kv.book explains why others hold it back too)."""

    request_id: str
    rank: int  # its tier's place in the room's order (0: critical)
    expected_tokens: float  # what the engine would hold for it (its footprint x the ratio)
    sequences: int
    since_s: float = 0.0  # when it first became the head (the fleet's clock)
    until_s: float = math.inf  # it is forgotten past this unless published again


@dataclass(frozen=True, slots=True)
class HeldBack:
    tokens: float = 0.0
    sequences: int = 0


class HeadBoard:
    """Each replica's blocked heads of line, per pool, as the fleet's ledger keeps them
    (kv_head.lua and kv_hold.lua in Redis). A request leaves free what the heads ahead of it
    need: every other replica's head of a higher tier, and of its own tier when it is not a
    head itself or when that head became one earlier (a total order: two heads never wait
    for each other)."""

    def __init__(self) -> None:
        self._heads: dict[str, dict[str, HeadOfLine]] = {}  # pool -> owner -> head

    def publish(self, pool: str, owner: str, head: HeadOfLine | None, now_s: float) -> None:
        heads = self._heads.setdefault(pool, {})
        if head is None:
            heads.pop(owner, None)
            return
        known = heads.get(owner)
        since_s = known.since_s if known and known.request_id == head.request_id else now_s
        heads[owner] = dataclasses.replace(head, since_s=since_s)

    def held_back(
        self, pool: str, owner: str, request_id: str, rank: int, now_s: float
    ) -> HeldBack:
        heads = self._heads.get(pool, {})
        for name in [n for n, h in heads.items() if h.until_s <= now_s]:
            del heads[name]
        mine = heads.get(owner)
        if mine is not None and mine.request_id != request_id:
            mine = None
        tokens, sequences = 0.0, 0
        for name, head in heads.items():
            if name == owner:
                continue
            ahead = head.rank < rank or (
                head.rank == rank and (mine is None or head.since_s < mine.since_s)
            )
            if ahead:
                tokens += head.expected_tokens
                sequences += head.sequences
        return HeldBack(tokens, sequences)

    def taken(self, pool: str, owner: str, request_id: str) -> None:
        """The head was admitted: it holds nothing back any more."""
        heads = self._heads.get(pool, {})
        head = heads.get(owner)
        if head is not None and head.request_id == request_id:
            del heads[owner]


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool's committed footprint as a ledger counts it: KV tokens held, the part of them
    held by requests that run to their limit, batch slots held, and the footprint ratio."""

    tokens: int = 0
    fixed: int = 0
    sequences: int = 0
    ratio: float = 1.0
    # Since the ledger began: what every release gave back, and how many there were (the
    # rate at which the pool frees room: the waiting room's drain, the whole fleet's).
    freed_tokens: int = 0
    freed_sequences: int = 0
    ends: int = 0

    def expected(self, extra_tokens: int = 0, extra_fixed: bool = False) -> float:
        """What the engine is expected to hold (plus one more request): the discountable
        part times the ratio, the fixed part never below its count."""
        total = self.tokens + extra_tokens
        fixed = self.fixed + (extra_tokens if extra_fixed else 0)
        return (total - fixed) * self.ratio + fixed * max(1.0, self.ratio)

    def over(
        self,
        capacity: PoolCapacity,
        share: float,
        tokens: int,
        sequences: int,
        fixed: bool,
        held_back: HeldBack | None = None,
    ) -> str:
        """What is full for one more request of `tokens` and `sequences` ("" when it fits),
        leaving `held_back` free (blocked heads of line elsewhere in the fleet)."""
        back = held_back or HeldBack()
        return _over(
            capacity,
            share,
            self.expected(tokens, fixed) + back.tokens,
            self.sequences + sequences + back.sequences,
        )


@dataclass(frozen=True, slots=True)
class KvVerdict:
    admitted: bool
    limit: str  # "" when admitted, else what is full: "kv_cache" or "sequences"
    in_flight_tokens: int  # the pool's committed footprint after this decision
    in_flight_requests: int


class KvLedger:
    min_ratio = 0.1  # never trust the engine to hold less than a tenth of the upper bound
    max_ratio = 4.0  # ... nor more than four times what was counted
    min_share = 0.05  # ... nor learn from a pool this sidecar barely uses
    decay = 0.1  # how fast the ratio follows the engine down; up, it follows at once
    sustain = 3  # readings in a row above the count before the ratio goes past 1.0

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # pool -> tokens held by admitted requests
        self.requests: dict[str, int] = {}  # pool -> batch slots held (one per completion)
        # pool -> the part of in_flight held by requests that run to their limit
        self.fixed: dict[str, int] = {}
        # id -> (pool, tokens, slots, fixed, deadline): what each admitted request holds
        self._held: dict[str, tuple[str, int, int, bool, float]] = {}
        self.freed: dict[str, tuple[int, int, int]] = {}  # pool -> (tokens, slots, ends)
        # pool -> what the engine really holds per counted token (1.0: the upper bound).
        self.ratio: dict[str, float] = {}
        self._recent: dict[str, deque[float]] = {}  # pool -> the last `sustain` readings

    def observe(self, pool: str, engine_kv_usage: float | None, capacity_tokens: float) -> None:
        """Learn how much of the counted footprint the engine really holds, from its own KV
        usage (scraped). Up at once (the safe side), down slowly; no reading: back to the
        upper bound (1.0). A stale engine reads as full, which raises the ratio."""
        counted = self.in_flight.get(pool, 0)
        current = self.ratio.get(pool, 1.0)
        if engine_kv_usage is None:
            self.ratio[pool] = max(1.0, current)
            return
        if counted < self.min_share * capacity_tokens:
            if engine_kv_usage >= 1.0:
                self.ratio[pool] = max(1.0, current)  # full without our traffic: no discount
            return  # too little in flight to tell
        raw = engine_kv_usage * capacity_tokens / counted
        recent = self._recent.setdefault(pool, deque(maxlen=self.sustain))
        recent.append(raw)
        sample = min(self.max_ratio, max(self.min_ratio, raw))
        if sample > 1.0:
            sustained = min(recent) if len(recent) == self.sustain else 1.0
            sample = min(sample, max(1.0, sustained))
        if sample >= current:
            self.ratio[pool] = sample
        else:
            self.ratio[pool] = current + self.decay * (sample - current)

    def observe_pools(
        self,
        pools: Mapping[str, Pool],
        replicas: int,
        kv_cache_usage: Callable[[str], float | None],
    ) -> list[str]:
        """`observe` every pool with a KV capacity; returns their names. The engine's usage
        is the whole pool's, set against this sidecar's part of the capacity and its own
        count: with even load balancing, the same ratio."""
        observed = []
        for name, pool in pools.items():
            capacity = pool_capacity(pool, replicas)
            if capacity is not None and capacity.kv_tokens is not None:
                self.observe(name, kv_cache_usage(name), capacity.kv_tokens)
                observed.append(name)
        return observed

    def view(self, pool: str) -> PoolView:
        return PoolView(
            self.in_flight.get(pool, 0),
            self.fixed.get(pool, 0),
            self.requests.get(pool, 0),
            self.ratio.get(pool, 1.0),
            *self.freed.get(pool, (0, 0, 0)),
        )

    def expected(self, pool: str, extra_tokens: int = 0, extra_fixed: bool = False) -> float:
        """What the engine is expected to hold for this ledger's admissions (plus one more)."""
        return self.view(pool).expected(extra_tokens, extra_fixed)

    def admit(
        self,
        request_id: str,
        pool: str,
        tokens: int,
        capacity: PoolCapacity,
        share: float,
        sequences: int = 1,
        fixed: bool = False,
        deadline_s: float = math.inf,
        held_back: HeldBack | None = None,
    ) -> KvVerdict:
        """Hold `tokens` and `sequences` batch slots of `pool` for the request if the tier's
        share of both leaves room (and `held_back` free). `fixed`: the request runs to its
        limit, so its footprint is never discounted by a ratio below 1. `deadline_s`: when
        `expire` frees it if nothing released it before (its end was never seen)."""
        current = self.in_flight.get(pool, 0)
        running = self.requests.get(pool, 0)
        if request_id in self._held:  # asked again (a retry): the same hold, not a second
            return KvVerdict(True, "", current, running)
        full = self.view(pool).over(capacity, share, tokens, sequences, fixed, held_back)
        if full:
            return KvVerdict(False, full, current, running)
        self.in_flight[pool] = current + tokens
        self.requests[pool] = running + sequences
        if fixed:
            self.fixed[pool] = self.fixed.get(pool, 0) + tokens
        self._held[request_id] = (pool, tokens, sequences, fixed, deadline_s)
        return KvVerdict(True, "", current + tokens, running + sequences)

    def release(self, request_id: str) -> Freed | None:
        """Free what the request held; None when it held nothing (never admitted, or done)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        pool, tokens, sequences, fixed, _ = held
        self.in_flight[pool] -= tokens
        self.requests[pool] -= sequences
        if fixed:
            self.fixed[pool] -= tokens
        freed_tokens, freed_sequences, ends = self.freed.get(pool, (0, 0, 0))
        self.freed[pool] = (freed_tokens + tokens, freed_sequences + sequences, ends + 1)
        return Freed(pool, tokens, sequences)

    def expire(self, now_s: float) -> list[tuple[str, Freed]]:
        """Free every hold past its deadline; what each id freed. A safety net: every way a
        request ends releases it, but a hold must never outlive its request by much."""
        late = [rid for rid, held in self._held.items() if held[4] <= now_s]
        expired = [(rid, self.release(rid)) for rid in late]
        return [(rid, freed) for rid, freed in expired if freed is not None]

    @property
    def holds(self) -> int:
        return len(self._held)

    def held_items(self) -> list[tuple[str, tuple[str, int, int, bool, float]]]:
        """Every hold: id -> (pool, tokens, batch slots, fixed, deadline)."""
        return list(self._held.items())

    def held_by_pool(self) -> tuple[dict[str, int], dict[str, int]]:
        """(KV tokens, batch slots) held per pool: what the admission gauges show."""
        return self.in_flight, self.requests


def never_fits(
    ratio: float, tokens: int, capacity: PoolCapacity, share: float, sequences: int, fixed: bool
) -> str:
    """What a request could not fit even in an empty pool at footprint ratio `ratio`."""
    return PoolView(ratio=ratio).over(capacity, share, tokens, sequences, fixed)


def _over(capacity: PoolCapacity, share: float, expected_tokens: float, sequences: int) -> str:
    """What a tier's share of `capacity` cannot hold of `expected_tokens` of KV and
    `sequences` batch slots: "kv_cache", "sequences", or "" when both fit."""
    if capacity.kv_tokens is not None and expected_tokens > capacity.kv_tokens * share:
        return "kv_cache"
    if capacity.sequences is not None and sequences > capacity.sequences * share:
        return "sequences"
    return ""
