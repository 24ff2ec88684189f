"""KV-cache admission: each pool's KV capacity, shared out by tier, against what is in flight.

What lives here: `kv_footprint` (the cache a request can hold: its whole context, prompt +
max_tokens, times its bucket's KV weight) and `KvLedger`, which counts the footprints of
the requests this sidecar admitted and has not yet seen finish, per pool. Pure: no clock,
no I/O; the sidecar and the offline simulator call the same methods.

Why: the breaker and the quota controller read the engines through a metrics scrape, seconds
late, and a 10x burst fills a KV cache in less. The ledger knows each admission the moment
it happens. A tier may fill its pool up to its share (default: critical 100%, standard
95%, sheddable 85%), so the last 5-15% stays free for the tiers above it and a burst
meets a refusal here (429, retry) rather than an OOM or a queue in the engine.

The footprint is an upper bound: the engine holds the prompt plus the tokens generated so
far, not max_tokens from the start. Capacity is per sidecar: with `replicas` sidecars in
front of a pool, each admits against capacity / replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from budget.policy import ContextBucket


def kv_footprint(context_tokens: int, bucket: ContextBucket) -> int:
    return math.ceil(context_tokens * bucket.kv_weight)


@dataclass(frozen=True, slots=True)
class KvVerdict:
    admitted: bool
    in_flight_tokens: int  # the pool's committed footprint after this decision
    ceiling_tokens: int  # what this tier may fill the pool to


class KvLedger:
    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # pool -> tokens held by admitted requests
        self._held: dict[str, tuple[str, int]] = {}  # request id -> (pool, tokens)

    def admit(
        self, request_id: str, pool: str, tokens: int, capacity_tokens: float, share: float
    ) -> KvVerdict:
        """Hold `tokens` of `pool` for the request if the tier's share leaves room."""
        current = self.in_flight.get(pool, 0)
        ceiling = math.floor(capacity_tokens * share)
        if current + tokens > ceiling:
            return KvVerdict(False, current, ceiling)
        self.in_flight[pool] = current + tokens
        self._held[request_id] = (pool, tokens)
        return KvVerdict(True, current + tokens, ceiling)

    def release(self, request_id: str) -> bool:
        """Free what the request held; False when it held nothing (never admitted, or done)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        pool, tokens = held
        self.in_flight[pool] -= tokens
        return True

    def usage(self, pool: str, capacity_tokens: float) -> float:
        return self.in_flight.get(pool, 0) / capacity_tokens
