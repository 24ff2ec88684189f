"""Budget arithmetic for one API key: reserve on the request, settle on the response.

What lives here: the limits, the key's state and two pure functions, `reserve` and `settle`,
that move the state forward at a time `now_s` the caller passes in. No I/O, no clock. The
Redis store runs the same arithmetic in Lua (budget/lua/*.lua); one test suite holds both
to identical behaviour.

Each rate limit is a token bucket holding at most its limit and refilling at limit/window
per second: 'requests' (requests per minute), 'tokens' (weighted tokens per minute: a
long-context token costs its bucket's weight) and 'hour' (raw tokens per hour). A
reservation takes from every bucket at once or from none, plus one concurrency slot.
Settling gives back what the request did not use (or takes the overage, never below
zero) and frees the slot. A reservation whose settlement never comes expires after its
ttl: the slot is freed and the reserved charge stays spent (it may have been used).
Usage is also kept in 10-second slots for the 1 min / 5 min / 1 h views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from policy.domain import Limits

USAGE_SLOT_S = 10
USAGE_HORIZON_S = 3600
# (bucket, window in seconds); the limit of each comes from `Limits`.
BUCKETS: tuple[tuple[str, int], ...] = (("requests", 60), ("tokens", 60), ("hour", 3600))


def scale_limits(limits: Limits, factor: float) -> Limits:
    """Every rate and the concurrency scaled by `factor` (at least 1 each, so a key is never
    frozen shut); the per-request context cap is not a rate and stays."""
    if factor == 1.0:
        return limits

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, math.floor(value * factor))

    return Limits(
        requests_per_minute=part(limits.requests_per_minute),
        tokens_per_minute=part(limits.tokens_per_minute),
        tokens_per_hour=part(limits.tokens_per_hour),
        concurrent_requests=part(limits.concurrent_requests),
        max_context_tokens=limits.max_context_tokens,
    )


@dataclass(frozen=True, slots=True)
class Charge:
    weighted_tokens: float  # (prompt + completion) x the context bucket's cost weight
    raw_tokens: int  # prompt + completion

    def amount(self, bucket: str) -> float:
        if bucket == "requests":
            return 1.0
        return self.weighted_tokens if bucket == "tokens" else float(self.raw_tokens)


@dataclass(slots=True)
class Reservation:
    charge: Charge
    expires_s: float


@dataclass(slots=True)
class KeyState:
    levels: dict[str, float] = field(default_factory=dict)  # bucket -> tokens available
    updated_s: float | None = None
    reservations: dict[str, Reservation] = field(default_factory=dict)
    usage_slots: dict[int, float] = field(default_factory=dict)  # slot start -> raw tokens


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    reason: str  # "ok", or the first limit that refused: requests, tokens, hour, concurrency
    retry_after_s: float | None  # None: admitted, or never admissible under these limits
    # OpenAI's rate-limit headers: limits, what remains after this request, reset time.
    limit_requests: int | None
    remaining_requests: int | None
    limit_tokens: int | None
    remaining_tokens: int | None
    reset_tokens_s: float


def _refill(state: KeyState, limits: Limits, now_s: float) -> None:
    elapsed_s = 0.0 if state.updated_s is None else max(0.0, now_s - state.updated_s)
    for bucket, window_s in BUCKETS:
        capacity = limits.capacity(bucket)
        if capacity is None:
            state.levels.pop(bucket, None)
            continue
        level = state.levels.get(bucket, float(capacity))
        state.levels[bucket] = min(float(capacity), level + elapsed_s * capacity / window_s)
    state.updated_s = now_s if state.updated_s is None else max(state.updated_s, now_s)


def _expire(state: KeyState, now_s: float) -> int:
    expired = [rid for rid, r in state.reservations.items() if r.expires_s <= now_s]
    for rid in expired:
        del state.reservations[rid]
    return len(expired)


def _verdict(
    state: KeyState, limits: Limits, admitted: bool, reason: str, retry_after_s: float | None
) -> Verdict:
    tokens_cap = limits.tokens_per_minute
    tokens_level = state.levels.get("tokens")
    reset_s = 0.0
    if tokens_cap is not None and tokens_level is not None:
        reset_s = (tokens_cap - tokens_level) * 60.0 / tokens_cap
    requests_level = state.levels.get("requests")
    return Verdict(
        admitted=admitted,
        reason=reason,
        retry_after_s=retry_after_s,
        limit_requests=limits.requests_per_minute,
        remaining_requests=None if requests_level is None else math.floor(requests_level),
        limit_tokens=tokens_cap,
        remaining_tokens=None if tokens_level is None else math.floor(tokens_level),
        reset_tokens_s=reset_s,
    )


def reserve(
    state: KeyState,
    limits: Limits,
    charge: Charge,
    reservation_id: str,
    now_s: float,
    ttl_s: float,
) -> Verdict:
    _expire(state, now_s)
    _refill(state, limits, now_s)
    if (
        limits.concurrent_requests is not None
        and len(state.reservations) >= limits.concurrent_requests
    ):
        # A slot frees when a request finishes: no honest wait time, so a short hint.
        return _verdict(state, limits, False, "concurrency", 1.0)
    for bucket, window_s in BUCKETS:
        capacity = limits.capacity(bucket)
        if capacity is None:
            continue
        need = charge.amount(bucket)
        level = state.levels[bucket]
        if need > capacity:
            return _verdict(state, limits, False, bucket, None)  # never fits
        if need > level:
            wait_s = (need - level) * window_s / capacity
            # Report the longest wait among the buckets that refuse, not just the first.
            for other, other_window_s in BUCKETS:
                other_cap = limits.capacity(other)
                if other_cap is None:
                    continue
                deficit = charge.amount(other) - state.levels[other]
                if deficit > 0:
                    wait_s = max(wait_s, deficit * other_window_s / other_cap)
            return _verdict(state, limits, False, bucket, wait_s)
    for bucket, _ in BUCKETS:
        if bucket in state.levels:
            state.levels[bucket] -= charge.amount(bucket)
    state.reservations[reservation_id] = Reservation(charge, now_s + ttl_s)
    return _verdict(state, limits, True, "ok", None)


def settle(
    state: KeyState,
    limits: Limits,
    reservation_id: str,
    actual: Charge | None,
    now_s: float,
) -> bool:
    """Replace a reservation's charge with what was used; None refunds it all.

    False when the reservation is unknown (already settled, or expired).
    """
    reservation = state.reservations.pop(reservation_id, None)
    if reservation is None:
        return False
    _refill(state, limits, now_s)
    used = actual if actual is not None else Charge(0.0, 0)
    for bucket, _ in BUCKETS:
        capacity = limits.capacity(bucket)
        if capacity is None or bucket == "requests":
            continue  # a request that ran counts as one request, whatever it used
        delta = reservation.charge.amount(bucket) - used.amount(bucket)
        state.levels[bucket] = min(float(capacity), max(0.0, state.levels[bucket] + delta))
    if actual is None:
        if "requests" in state.levels and limits.requests_per_minute is not None:
            state.levels["requests"] = min(
                float(limits.requests_per_minute), state.levels["requests"] + 1.0
            )
    elif used.raw_tokens > 0:
        slot = int(now_s // USAGE_SLOT_S) * USAGE_SLOT_S
        state.usage_slots[slot] = state.usage_slots.get(slot, 0.0) + used.raw_tokens
        oldest = slot - USAGE_HORIZON_S
        for old in [s for s in state.usage_slots if s <= oldest]:
            del state.usage_slots[old]
    return True


def usage(state: KeyState, now_s: float, window_s: int) -> float:
    """Raw tokens settled in the last `window_s` seconds (10-second resolution)."""
    oldest = now_s - window_s
    return sum(t for s, t in state.usage_slots.items() if s + USAGE_SLOT_S > oldest)
