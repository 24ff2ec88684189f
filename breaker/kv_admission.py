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

The footprint is an upper bound: the engine holds the prompt plus the tokens generated so
far, not max_tokens from the start, and clients often send max_tokens far above what they
get back (4096 for a 200-token answer counts 3-5x too much). So the ledger learns, per pool,
the ratio of what the engine reports holding (its scraped KV usage) to what it counted, and
admits against counted x ratio: up at once when the engine is fuller than thought, down
slowly, back to 1.0 when the engine's metrics go stale. Each admission is still counted the
moment it happens; only the conversion to real cache is learned. Capacity is per sidecar:
with `replicas` sidecars in front of a pool, each admits against capacity / replicas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from policy import ContextBucket, Pool


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


@dataclass(frozen=True, slots=True)
class KvVerdict:
    admitted: bool
    limit: str  # "" when admitted, else what is full: "kv_cache" or "sequences"
    in_flight_tokens: int  # the pool's committed footprint after this decision
    in_flight_requests: int


class KvLedger:
    min_ratio = 0.1  # never trust the engine to hold less than a tenth of the upper bound
    min_share = 0.05  # ... nor learn from a pool this sidecar barely uses
    decay = 0.1  # how fast the ratio follows the engine down; up, it follows at once

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # pool -> tokens held by admitted requests
        self.requests: dict[str, int] = {}  # pool -> admitted requests not yet ended
        self._held: dict[str, tuple[str, int]] = {}  # request id -> (pool, tokens)
        # pool -> what the engine really holds per counted token (1.0: the upper bound).
        self.ratio: dict[str, float] = {}

    def observe(self, pool: str, engine_kv_usage: float | None, capacity_tokens: float) -> None:
        """Learn how much of the counted footprint the engine really holds, from its own KV
        usage (scraped). Up at once (the safe side), down slowly; no reading, or a stale
        one (reported as 1.0): back toward the upper bound."""
        counted = self.in_flight.get(pool, 0)
        current = self.ratio.get(pool, 1.0)
        if engine_kv_usage is None or engine_kv_usage >= 1.0:
            self.ratio[pool] = 1.0
            return
        if counted < self.min_share * capacity_tokens:
            return  # too little in flight to tell
        sample = min(1.0, max(self.min_ratio, engine_kv_usage * capacity_tokens / counted))
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

    def admit(
        self, request_id: str, pool: str, tokens: int, capacity: PoolCapacity, share: float
    ) -> KvVerdict:
        """Hold `tokens` and a batch slot of `pool` for the request if the tier's share of
        both leaves room."""
        current = self.in_flight.get(pool, 0)
        running = self.requests.get(pool, 0)
        ratio = self.ratio.get(pool, 1.0)
        if (
            capacity.kv_tokens is not None
            and (current + tokens) * ratio > capacity.kv_tokens * share
        ):
            return KvVerdict(False, "kv_cache", current, running)
        if capacity.sequences is not None and running + 1 > capacity.sequences * share:
            return KvVerdict(False, "sequences", current, running)
        self.in_flight[pool] = current + tokens
        self.requests[pool] = running + 1
        self._held[request_id] = (pool, tokens)
        return KvVerdict(True, "", current + tokens, running + 1)

    def release(self, request_id: str) -> bool:
        """Free what the request held; False when it held nothing (never admitted, or done)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        pool, tokens = held
        self.in_flight[pool] -= tokens
        self.requests[pool] -= 1
        return True
