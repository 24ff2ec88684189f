"""Where spend state lives: the `SpendStore` interface and the in-process store.

The in-process store applies budget.spend directly (one process, or `budget.store:
memory`); the Redis store (budget.spend_redis) runs the same arithmetic in Lua, shared by
every replica. Both take an optional clock for reservation expiry (tests pass a virtual
one); the windows themselves come from the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from budget.spend import (
    DAY_S,
    SpendHold,
    SpendVerdict,
    WindowState,
    reserve,
    settle,
    settle_unverified,
)


class SpendStore(Protocol):
    async def reserve(self, hold: SpendHold, reservation_id: str, ttl_s: float) -> SpendVerdict:
        """Reserve `hold.amount` in each of the hold's windows, or in none."""
        ...

    async def settle(
        self, tenant: str, window_ids: Sequence[str], reservation_id: str, actual: float | None
    ) -> dict[str, float] | None:
        """What each window holds after; None when the reservation was unknown."""
        ...

    async def settle_unverified(
        self, hold: SpendHold, reservation_id: str, actual: float | None, ttl_s: float
    ) -> dict[str, float] | None:
        """Settle a request whose reservation is unknown (budget.spend.settle_unverified):
        safe to retry, and a reservation landing after it holds nothing. None: settled
        already."""
        ...

    async def used(self, tenant: str, window_ids: Sequence[str]) -> dict[str, float]:
        """Spent plus held per window (0 for a window never charged)."""
        ...

    async def close(self) -> None: ...


class InProcessSpendStore:
    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.time
        self._windows: dict[tuple[str, str], WindowState] = {}
        self._ends_s: dict[tuple[str, str], float] = {}

    def _states(self, tenant: str, window_ids: Sequence[str]) -> dict[str, WindowState]:
        return {wid: self._windows.setdefault((tenant, wid), WindowState()) for wid in window_ids}

    def _forget_ended(self, now_s: float) -> None:
        """A window a day past its end is read by no one any more."""
        for ended in [k for k, ends_s in self._ends_s.items() if ends_s + DAY_S < now_s]:
            self._windows.pop(ended, None)
            del self._ends_s[ended]

    def _track(self, hold: SpendHold, now_s: float) -> None:
        for span in hold.spans:
            if (hold.tenant, span.id) not in self._ends_s:
                self._forget_ended(now_s)  # once per new window: cheap enough
                self._ends_s[(hold.tenant, span.id)] = span.ends_s

    async def reserve(self, hold: SpendHold, reservation_id: str, ttl_s: float) -> SpendVerdict:
        now_s = self._clock()
        self._track(hold, now_s)
        states = self._states(hold.tenant, hold.window_ids)
        return reserve(states, hold.spans, hold.amount, reservation_id, now_s, ttl_s)

    async def settle(
        self, tenant: str, window_ids: Sequence[str], reservation_id: str, actual: float | None
    ) -> dict[str, float] | None:
        return settle(self._states(tenant, window_ids), reservation_id, actual)

    async def settle_unverified(
        self, hold: SpendHold, reservation_id: str, actual: float | None, ttl_s: float
    ) -> dict[str, float] | None:
        self._track(hold, self._clock())
        states = self._states(hold.tenant, hold.window_ids)
        return settle_unverified(states, reservation_id, actual, self._clock(), ttl_s)

    async def used(self, tenant: str, window_ids: Sequence[str]) -> dict[str, float]:
        now_s = self._clock()
        out = {}
        for wid in window_ids:
            state = self._windows.get((tenant, wid))
            if state is not None:
                state.expire(now_s)
            out[wid] = 0.0 if state is None else state.used
        return out

    async def close(self) -> None:
        return None
