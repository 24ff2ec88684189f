"""Lua scripts on Redis: loaded once, called with EVALSHA, reloaded after a restart.

What lives here: `Scripts`, which every store that keeps shared state in Redis uses (the
budgets, budget.redis_store; the spend budgets, budget.spend_redis; the fleet's KV ledger,
admission.kv.redis_ledger); `script`, which reads a script shipped in a package's lua/
folder (budget/lua/, admission/kv/lua/); `family`, a store's scripts each behind the
preludes they share; and `LuaStore`, what those stores are built from. A NOSCRIPT reply
(Redis restarted, or a failover to a replica that never saw the script) reloads and
retries once. Any Redis error or timeout becomes a `BudgetStoreError`, so the caller can
degrade.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, ClassVar

from redis import exceptions as redis_errors

from budget.store import BudgetStoreError


def script(name: str, package: str = "budget") -> str:
    """A Lua script shipped in `package`'s lua/ folder: budget/lua/ (the budgets' scripts and
    `time.lua`, the prelude every script starts with) or admission/kv/lua/ (the KV ledger's).
    """
    return resources.files(package).joinpath("lua", name).read_text(encoding="utf-8")


def family(common: str, names: Sequence[str], package: str = "budget") -> dict[str, str]:
    """The sources of a store's scripts `names`, each behind time.lua (the time it runs at,
    one copy in budget/lua/) and the `common` helpers of its family (in `package`)."""
    prelude = script("time.lua") + script(common, package)
    return {name: prelude + script(name, package) for name in names}


class Scripts:
    def __init__(
        self, client: Any, sources: dict[str, str], timeout_s: float | None = None
    ) -> None:
        self.client = client  # redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster
        self._sources = sources
        self._timeout_s = timeout_s
        self._shas: dict[str, str] = {}

    # asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps every call in a task of
    # its own (~15 µs of CPU a round trip, on the request path).
    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._evalsha(name, keys, args)
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(f"redis {name}: {type(error).__name__}: {error}") from error

    async def command(self, what: str, call: Any) -> Any:
        """A plain command (an awaitable from the client), with the same timeout and errors."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
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


class LuaStore:
    """A store whose shared state lives in Redis and is kept by its own family of scripts
    (`COMMON` and `SCRIPTS`, in `PACKAGE`'s lua/ folder). `clock`: the time the scripts
    run at (None: the Redis server's TIME; tests pass a virtual one). Every key starts with
    `prefix`."""

    COMMON: ClassVar[str]
    SCRIPTS: ClassVar[tuple[str, ...]]
    PACKAGE: ClassVar[str] = "budget"

    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster
        clock: Callable[[], float] | None = None,
        prefix: str = "slogate",
        timeout_s: float | None = None,
    ) -> None:
        self._scripts = Scripts(client, family(self.COMMON, self.SCRIPTS, self.PACKAGE), timeout_s)
        self._clock = clock
        self._prefix = prefix

    def _now_arg(self) -> str:
        """time.lua's argument, every script's first: the injected clock's time, or -1 for
        the Redis server's TIME."""
        return repr(self._clock()) if self._clock is not None else "-1"
