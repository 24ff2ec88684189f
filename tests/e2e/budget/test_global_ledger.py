"""ONE suite, every global ledger (tests/support/global_ledger_suite.py), run here on a real
Redis-compatible server (budget/lua/lease_report.lua); the in-process ledger and the Redis
one side by side on random report sequences, answering the same leases; and a ledger that
cannot be reached raising BudgetStoreError. The in-process run: tests/budget/test_global_ledger.py.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from budget.global_ledger import GlobalLedger, RedisGlobalLedger
from budget.leases import Lease, LeaseSettings, PoolRoom, Report, TenantReport
from budget.redis_store import connect
from budget.store import BudgetStoreError
from tests.support.clock import VirtualClock
from tests.support.global_ledger_suite import *  # noqa: F403  (the suite's tests, collected here)
from tests.support.global_ledger_suite import SETTINGS, open_ledger
from tooling.stack.processes import free_port


@pytest.fixture(params=["redis"])
async def ledger(
    request: pytest.FixtureRequest, clock: VirtualClock
) -> AsyncIterator[GlobalLedger]:
    made = open_ledger(request, request.param, clock)
    yield made
    await made.close()


def _same(memory: Lease, redis: Lease) -> None:
    assert (redis.region, redis.seq, redis.lease_s, redis.rebalanced, redis.peers) == (
        memory.region,
        memory.seq,
        memory.lease_s,
        memory.rebalanced,
        memory.peers,
    )
    assert redis.tenants.keys() == memory.tenants.keys()
    for tenant, line in memory.tenants.items():
        other = redis.tenants[tenant]
        assert other.share == pytest.approx(line.share, abs=1e-9)
        assert other.global_usage == pytest.approx(line.global_usage, rel=1e-12)
        assert other.global_spend == pytest.approx(line.global_spend, rel=1e-12)
        assert other.spend_ceiling == pytest.approx(line.spend_ceiling, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
async def test_the_lua_answers_what_apply_report_answers(
    request: pytest.FixtureRequest, clock: VirtualClock, seed: int
) -> None:
    """Random reports from three regions on two tenants (stale seqs, new windows, silences
    past the lease and the fallback), through both ledgers on one clock."""
    rng = random.Random(seed)
    settings = LeaseSettings(10.0, 20.0, rng.choice([0.0, 0.05]), rng.choice([None, 0.2]))
    memory = open_ledger(request, "memory", clock, settings)
    redis = open_ledger(request, "redis", clock, settings)
    seqs = {"eu": 0, "us": 0, "ap": 0}
    usage: dict[tuple[str, str], float] = {}
    try:
        for _ in range(120):
            clock.advance(rng.choice([0.1, 0.5, 1.0, 3.0, 12.0]))
            region = rng.choice(list(seqs))
            seqs[region] += rng.choice([1, 1, 1, 0, -1])
            day = rng.choice(["day:2026-12-05", "day:2026-12-05", "day:2026-12-06"])
            lines = []
            for tenant in rng.sample(["acme", "globex"], rng.randint(1, 2)):
                usage[(region, tenant)] = usage.get((region, tenant), 0.0) + rng.uniform(0, 500)
                lines.append(
                    TenantReport(
                        tenant,
                        rng.choice([0.0, rng.uniform(0, 1000)]),
                        usage[(region, tenant)],
                        {day: rng.uniform(0, 60), "month:2026-12": rng.uniform(0, 300)},
                        rng.uniform(0, 0.5),
                        {day: 100.0, "month:2026-12": 1000.0},
                        {day: rng.uniform(0, 100)},
                    )
                )
            pools = {"chat": PoolRoom(rng.randint(0, 3), rng.random() < 0.3)}
            sent = Report(region, seqs[region], tuple(lines), pools)
            _same(await memory.report(sent), await redis.report(sent))
    finally:
        await redis.close()


async def test_an_unreachable_ledger_raises_a_store_error() -> None:
    ledger = RedisGlobalLedger(connect(f"redis://127.0.0.1:{free_port()}"), SETTINGS, timeout_s=0.5)
    with pytest.raises(BudgetStoreError):
        await ledger.report(Report("eu", 1, (), {}))
    await ledger.close()
