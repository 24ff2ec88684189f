"""The Redis store: budget.ledger's arithmetic as Lua scripts, one round trip per operation.

Scripts are loaded once and called with EVALSHA (budget.redis_scripts). Every key of one API
key shares a hash tag (`slogate:{<key id>}:...`), so each script touches one Redis Cluster
slot. Time is the Redis server's TIME unless a clock is injected (tests). Any Redis error
or timeout becomes a `BudgetStoreError`, so the caller can degrade to local budgets.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from budget.ledger import USAGE_SLOT_S, Charge, Verdict
from budget.redis_scripts import LuaStore
from budget.store import USAGE_WINDOWS_S, BudgetStoreError
from policy.domain import Limits

# An idle key's state expires after two hours: longer than any window or reservation.
KEY_TTL_S = 7200


# redis-py's own bound on each socket write and read when the caller sets none.
SOCKET_TIMEOUT_S = 5.0


def connect(
    url: str,
    cluster: bool = False,
    max_connections: int = 64,
    socket_timeout_s: float | None = SOCKET_TIMEOUT_S,
) -> Any:
    """An asyncio client whose pool waits for a free connection instead of failing, and that
    retries a command once on a fresh connection: after a Redis restart every pooled
    connection is dead, and each would otherwise cost one decision its shared budget.

    `socket_timeout_s=None` drops redis-py's own timeouts around each write and read: for a
    client every call of which is bounded by its caller (the stores' `Scripts`, at the
    policy's `redis_timeout_ms`), they are a second bound that costs each round trip a task
    and a timer on Python 3.11 (~20 µs of CPU) and never fires first."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    retry = Retry(NoBackoff(), 1)
    if cluster:
        return _waiting_cluster().from_url(
            url, max_connections=max_connections, socket_timeout=socket_timeout_s
        )
    from redis.asyncio import BlockingConnectionPool, Redis

    # Retry settings belong to the connections, so they go to the pool, not to the client.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=None,
        retry=retry,
        retry_on_error=[redis_errors.ConnectionError],
        socket_timeout=socket_timeout_s,
    )
    return Redis(connection_pool=pool)


@functools.cache
def _waiting_cluster() -> Any:
    """redis-py's cluster client, made to wait for a free connection as the single server's
    BlockingConnectionPool does: its own pool raises MaxConnectionsError once a node has
    `max_connections` commands in flight (300 reservations gathered at once failed so, when
    a loaded machine exhausted its retries). At most that many commands are in flight."""
    from redis.asyncio.cluster import RedisCluster

    class WaitingCluster(RedisCluster):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_flight = asyncio.Semaphore(kwargs.get("max_connections", 100))

        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            async with self._in_flight:
                return await super().execute_command(*args, **kwargs)

    return WaitingCluster


def _limit(value: int | None) -> int:
    return -1 if value is None else value


def _optional_float(raw: Any) -> float | None:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return float(text) if text else None


def _optional_int(raw: Any) -> int | None:
    value = _optional_float(raw)
    return None if value is None else int(value)


class RedisStore(LuaStore):
    COMMON = "common.lua"
    SCRIPTS = ("reserve.lua", "settle.lua")

    def _keys(self, key_id: str, *parts: str) -> list[str]:
        return [f"{self._prefix}:{{{key_id}}}:{part}" for part in parts]

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts.run(name, keys, args)

    async def reserve(
        self, key_id: str, limits: Limits, charge: Charge, reservation_id: str, ttl_s: float
    ) -> Verdict:
        reply = await self._eval(
            "reserve.lua",
            self._keys(key_id, "state", "res", "exp"),
            [
                self._now_arg(),
                _limit(limits.requests_per_minute),
                _limit(limits.tokens_per_minute),
                _limit(limits.tokens_per_hour),
                _limit(limits.concurrent_requests),
                repr(float(charge.weighted_tokens)),
                charge.raw_tokens,
                reservation_id,
                repr(float(ttl_s)),
                KEY_TTL_S,
            ],
        )
        admitted, reason, retry, remaining_requests, remaining_tokens, reset = reply
        return Verdict(
            admitted=int(admitted) == 1,
            reason=reason.decode() if isinstance(reason, bytes) else str(reason),
            retry_after_s=_optional_float(retry),
            limit_requests=limits.requests_per_minute,
            remaining_requests=_optional_int(remaining_requests),
            limit_tokens=limits.tokens_per_minute,
            remaining_tokens=_optional_int(remaining_tokens),
            reset_tokens_s=_optional_float(reset) or 0.0,
        )

    async def settle(
        self, key_id: str, limits: Limits, reservation_id: str, actual: Charge | None
    ) -> bool:
        used_weighted = -1.0 if actual is None else float(actual.weighted_tokens)
        used_raw = 0 if actual is None else actual.raw_tokens
        reply = await self._eval(
            "settle.lua",
            self._keys(key_id, "state", "res", "exp", "use"),
            [
                self._now_arg(),
                _limit(limits.requests_per_minute),
                _limit(limits.tokens_per_minute),
                _limit(limits.tokens_per_hour),
                reservation_id,
                repr(used_weighted),
                used_raw,
                KEY_TTL_S,
            ],
        )
        return int(reply) == 1

    async def _server_now(self) -> float:
        if self._clock is not None:
            return self._clock()
        seconds, micros = await self._scripts.client.time()
        return float(seconds) + float(micros) / 1e6

    async def usage(
        self, key_id: str, windows_s: Sequence[int] = USAGE_WINDOWS_S
    ) -> dict[int, float]:
        try:
            async with asyncio.timeout(SOCKET_TIMEOUT_S):  # the client may have no timeout
                (use_key,) = self._keys(key_id, "use")
                slots = await self._scripts.client.hgetall(use_key)
                now_s = await self._server_now()
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(f"redis usage: {error}") from error
        parsed = {float(k): float(v) for k, v in slots.items()}
        return {
            w: sum(t for s, t in parsed.items() if s + USAGE_SLOT_S > now_s - w) for w in windows_s
        }

    async def outstanding(self, key_id: str) -> int:
        try:
            async with asyncio.timeout(SOCKET_TIMEOUT_S):
                (exp_key,) = self._keys(key_id, "exp")
                now_s = await self._server_now()
                return int(await self._scripts.client.zcount(exp_key, f"({now_s!r}", "+inf"))
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(f"redis outstanding: {error}") from error

    async def close(self) -> None:
        await self._scripts.client.aclose()
