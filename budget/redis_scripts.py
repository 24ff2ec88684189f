"""Lua scripts on Redis: loaded once, called with EVALSHA, reloaded after a restart.

What lives here: `Scripts`, which every store that keeps shared state in Redis uses (the
budgets, budget.redis_store; the fleet's KV ledger, admission.kv.redis_ledger), and
`script`, which reads a script shipped in a package's lua/ folder (budget/lua/,
admission/kv/lua/). A NOSCRIPT reply (Redis restarted, or
a failover to a replica that never saw the script) reloads and retries once. Any Redis
error or timeout becomes a `BudgetStoreError`, so the caller can degrade.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from redis import exceptions as redis_errors

from budget.store import BudgetStoreError


def script(name: str, package: str = "budget") -> str:
    """A Lua script shipped in `package`'s lua/ folder: budget/lua/ (the budgets' scripts and
    `time.lua`, the prelude every script starts with) or admission/kv/lua/ (the KV ledger's).
    """
    return resources.files(package).joinpath("lua", name).read_text(encoding="utf-8")


class Scripts:
    def __init__(
        self, client: Any, sources: dict[str, str], timeout_s: float | None = None
    ) -> None:
        self.client = client  # redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster
        self._sources = sources
        self._timeout_s = timeout_s
        self._shas: dict[str, str] = {}

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await asyncio.wait_for(self._evalsha(name, keys, args), self._timeout_s)
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(f"redis {name}: {type(error).__name__}: {error}") from error

    async def command(self, what: str, call: Any) -> Any:
        """A plain command (an awaitable from the client), with the same timeout and errors."""
        try:
            return await asyncio.wait_for(call, self._timeout_s)
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(f"redis {what}: {type(error).__name__}: {error}") from error

    async def _evalsha(self, name: str, keys: list[str], args: list[Any]) -> Any:
        sha = self._shas.get(name)
        if sha is None:
            sha = self._shas[name] = await self._load(name)
        try:
            return await self.client.evalsha(sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            self._shas[name] = await self._load(name)
            return await self.client.evalsha(self._shas[name], len(keys), *keys, *args)

    async def _load(self, name: str) -> str:
        result = await self.client.script_load(self._sources[name])
        if isinstance(result, dict):  # a cluster answers per node; the sha is the same
            result = next(iter(result.values()))
        return result.decode() if isinstance(result, bytes) else str(result)
