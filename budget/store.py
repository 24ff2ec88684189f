"""Where budget state lives: the `BudgetStore` interface and the in-process store.

The in-process store (the embedded default: `slogate up` needs no Redis) applies
budget.ledger directly; the Redis store (budget.redis_store) runs the same arithmetic in
Lua. Both take an optional clock: production uses the process clock (in-process) or the
Redis server's TIME; tests pass a virtual clock so one suite drives both through time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from budget.ledger import Charge, KeyState, Verdict, reserve, settle, usage
from policy.domain import Limits

USAGE_WINDOWS_S = (60, 300, 3600)


class BudgetStoreError(RuntimeError):
    """The store could not answer (Redis down or slow); the caller may degrade."""


class BudgetStore(Protocol):
    async def reserve(
        self, key_id: str, limits: Limits, charge: Charge, reservation_id: str, ttl_s: float
    ) -> Verdict: ...

    async def settle(
        self, key_id: str, limits: Limits, reservation_id: str, actual: Charge | None
    ) -> bool: ...

    async def usage(
        self, key_id: str, windows_s: Sequence[int] = USAGE_WINDOWS_S
    ) -> dict[int, float]: ...

    async def outstanding(self, key_id: str) -> int: ...

    async def close(self) -> None: ...


class InProcessStore:
    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.time
        self._keys: dict[str, KeyState] = {}

    def _state(self, key_id: str) -> KeyState:
        state = self._keys.get(key_id)
        if state is None:
            state = self._keys[key_id] = KeyState()
        return state

    async def reserve(
        self, key_id: str, limits: Limits, charge: Charge, reservation_id: str, ttl_s: float
    ) -> Verdict:
        return reserve(self._state(key_id), limits, charge, reservation_id, self._clock(), ttl_s)

    async def settle(
        self, key_id: str, limits: Limits, reservation_id: str, actual: Charge | None
    ) -> bool:
        return settle(self._state(key_id), limits, reservation_id, actual, self._clock())

    async def usage(
        self, key_id: str, windows_s: Sequence[int] = USAGE_WINDOWS_S
    ) -> dict[int, float]:
        state = self._state(key_id)
        now_s = self._clock()
        return {w: usage(state, now_s, w) for w in windows_s}

    async def outstanding(self, key_id: str) -> int:
        state = self._keys.get(key_id)
        if state is None:
            return 0
        now_s = self._clock()
        return sum(1 for r in state.reservations.values() if r.expires_s > now_s)

    async def close(self) -> None:
        return None
