"""A budget store's windows under other names: the candidate policy's budgets beside the
real ones in the same store (shadow mode, extproc.request.candidate).

What lives here: `PrefixedStore`, a `BudgetStore` that passes every call to the store it
wraps with the key's id prefixed (`candidate:` + the key's or tenant's budget id), so a
fleet sharing Redis judges the candidate's budgets on the whole fleet's traffic, as it
enforces the real ones, and the two never touch. It owns nothing: closing it closes
nothing (the wrapped store is the sidecar's).
"""

from __future__ import annotations

from collections.abc import Sequence

from budget.ledger import Charge, Verdict
from budget.store import USAGE_WINDOWS_S, BudgetStore
from policy.domain import Limits


class PrefixedStore:
    def __init__(self, store: BudgetStore, prefix: str) -> None:
        self._store = store
        self.prefix = prefix

    async def reserve(
        self, key_id: str, limits: Limits, charge: Charge, reservation_id: str, ttl_s: float
    ) -> Verdict:
        return await self._store.reserve(
            self.prefix + key_id, limits, charge, reservation_id, ttl_s
        )

    async def settle(
        self, key_id: str, limits: Limits, reservation_id: str, actual: Charge | None
    ) -> bool:
        return await self._store.settle(self.prefix + key_id, limits, reservation_id, actual)

    async def usage(
        self, key_id: str, windows_s: Sequence[int] = USAGE_WINDOWS_S
    ) -> dict[int, float]:
        return await self._store.usage(self.prefix + key_id, windows_s)

    async def outstanding(self, key_id: str) -> int:
        return await self._store.outstanding(self.prefix + key_id)

    async def close(self) -> None:
        return None
