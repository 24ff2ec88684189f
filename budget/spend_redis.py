"""The Redis spend store: budget.spend's arithmetic as Lua, shared exactly by every replica.

One EVALSHA per reserve or settle, over all of a tenant's windows at once (they share the
hash tag `{spend:<tenant>}`: one cluster slot). A window's keys expire a day after it ends.
Reservation expiry runs on the Redis server's TIME unless a clock is injected (tests);
which window a request falls in is the caller's (the sidecar's UTC wall clock). Any Redis
error or timeout becomes a `BudgetStoreError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from budget.redis_scripts import LuaStore
from budget.spend import DAY_S, SpendHold, SpendVerdict
from budget.store import BudgetStoreError


def _float(raw: Any) -> float:
    return float(raw.decode() if isinstance(raw, bytes) else raw)


class RedisSpendStore(LuaStore):
    COMMON = "spend_common.lua"
    SCRIPTS = ("spend_reserve.lua", "spend_settle.lua", "spend_settle_unverified.lua")

    def _keys(self, tenant: str, window_ids: Sequence[str]) -> list[str]:
        keys = []
        for wid in window_ids:
            hash_key = f"{self._prefix}:{{spend:{tenant}}}:{wid}"
            keys += [hash_key, f"{hash_key}:exp"]
        return keys

    async def reserve(self, hold: SpendHold, reservation_id: str, ttl_s: float) -> SpendVerdict:
        args: list[Any] = [
            self._now_arg(),
            repr(float(hold.amount)),
            reservation_id,
            repr(float(ttl_s)),
        ]
        for span in hold.spans:
            args += [repr(float(span.limit)), repr(span.ends_s + DAY_S)]
        reply = await self._scripts.run(
            "spend_reserve.lua", self._keys(hold.tenant, hold.window_ids), args
        )
        admitted, refused = int(reply[0]), int(reply[1])
        used = {s.id: _float(v) for s, v in zip(hold.spans, reply[2:], strict=True)}
        return SpendVerdict(admitted == 1, used, hold.spans[refused - 1] if refused else None)

    async def settle(
        self, tenant: str, window_ids: Sequence[str], reservation_id: str, actual: float | None
    ) -> dict[str, float] | None:
        spent = -1.0 if actual is None else float(actual)
        reply = await self._scripts.run(
            "spend_settle.lua", self._keys(tenant, window_ids), [reservation_id, repr(spent)]
        )
        if int(reply[0]) != 1:
            return None
        return {wid: _float(v) for wid, v in zip(window_ids, reply[1:], strict=True)}

    async def settle_unverified(
        self, hold: SpendHold, reservation_id: str, actual: float | None, ttl_s: float
    ) -> dict[str, float] | None:
        args: list[Any] = [
            self._now_arg(),
            reservation_id,
            repr(-1.0 if actual is None else float(actual)),
            repr(float(ttl_s)),
        ]
        args += [repr(span.ends_s + DAY_S) for span in hold.spans]
        reply = await self._scripts.run(
            "spend_settle_unverified.lua", self._keys(hold.tenant, hold.window_ids), args
        )
        if int(reply[0]) != 1:
            return None
        return {wid: _float(v) for wid, v in zip(hold.window_ids, reply[1:], strict=True)}

    async def used(self, tenant: str, window_ids: Sequence[str]) -> dict[str, float]:
        out = {}
        for wid, key in zip(window_ids, self._keys(tenant, window_ids)[::2], strict=True):
            spent, held = await self._scripts.command(
                "spend used", self._scripts.client.hmget(key, "spent", "held")
            )
            out[wid] = (0.0 if spent is None else _float(spent)) + max(
                0.0, 0.0 if held is None else _float(held)
            )
        return out

    async def close(self) -> None:
        return None  # the client is the budget store's; it closes it


__all__ = ["BudgetStoreError", "RedisSpendStore"]
