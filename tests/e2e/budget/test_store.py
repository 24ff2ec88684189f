"""ONE suite, every store (tests/support/budget_store_suite.py), run here on the real
servers: Redis, a 3-node Redis Cluster, and the candidate policy's windows in Redis; and a
Redis restart answered by reloading the scripts. In process: tests/budget/test_store.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from budget.ledger import Charge
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore
from extproc.runtime.processes import ManagedProcess
from policy.domain import Limits
from tests.support.budget_store_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.budget_store_suite import open_store, rid
from tests.support.clock import VirtualClock
from tooling.stack.redis import start_redis


@pytest.fixture(params=["redis", "cluster", "prefixed-redis"])
async def store(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[BudgetStore]:
    async with open_store(request, request.param, clock) as made:
        yield made


def test_redis_restart_reloads_scripts(tmp_path: Path) -> None:
    """NOSCRIPT after a restart is answered by reloading the script, not by an error."""

    async def scenario(port: int, proc: ManagedProcess) -> None:
        client = aioredis.Redis(host="127.0.0.1", port=port)
        store = RedisStore(client)
        limits = Limits(requests_per_minute=5)
        assert (await store.reserve("k", limits, Charge(1, 1), rid(), 60)).admitted
        await client.script_flush()  # what a restarted server looks like to EVALSHA
        assert (await store.reserve("k", limits, Charge(1, 1), rid(), 60)).admitted
        await store.close()

    proc, port = start_redis(tmp_path)
    try:
        asyncio.run(scenario(port, proc))
    finally:
        proc.stop()


def test_usage_slots_older_than_the_hour_leave_when_a_slot_opens(tmp_path: Path) -> None:
    """The usage hash keeps at most the hour's slots: the old ones go when a settle opens a
    new 10-second slot (settle.lua scans the hash only then, not at every settle)."""

    async def scenario(port: int) -> list[bytes]:
        client = aioredis.Redis(host="127.0.0.1", port=port)
        clock = VirtualClock(1_000_000.0)
        store = RedisStore(client, clock)
        for advance_s in (0, 5, 3600):  # two settles in one slot, then one past the hour
            clock.advance(advance_s)
            reservation = rid()
            await store.reserve("k", Limits(), Charge(1, 1), reservation, 60)
            await store.settle("k", Limits(), reservation, Charge(1, 1))
        slots = sorted(await client.hkeys("slogate:{k}:use"))
        await store.close()
        return slots

    proc, port = start_redis(tmp_path)
    try:
        slots = asyncio.run(scenario(port))
    finally:
        proc.stop()
    assert slots == [b"1003600"]


async def test_a_cluster_client_waits_for_a_free_connection_instead_of_failing(
    request: pytest.FixtureRequest,
) -> None:
    """More reservations at once than the client has connections: each waits its turn, as
    with one server's pool (redis-py's cluster pool raised MaxConnectionsError: CI saw 300
    gathered reservations fail so on a loaded machine)."""
    ports = request.getfixturevalue("cluster_ports")
    store = RedisStore(connect(f"redis://127.0.0.1:{ports[0]}", cluster=True, max_connections=4))
    limits = Limits(requests_per_minute=10_000, concurrent_requests=10_000)
    try:
        verdicts = await asyncio.gather(
            *(
                store.reserve(uuid.uuid4().hex[:12], limits, Charge(1, 1), rid(), 60)
                for _ in range(400)
            )
        )
    finally:
        await store.close()
    assert all(v.admitted for v in verdicts)
