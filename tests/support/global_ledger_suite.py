"""ONE suite, every global ledger: in process (budget.global_ledger.InProcessGlobalLedger)
and on a real Redis-compatible server (RedisGlobalLedger, its Lua), with a virtual clock.

The tests below are collected where they are imported with `*`, each module defining the
`ledger` fixture over its kinds with `open_ledger`: tests/budget/test_global_ledger.py in
process, tests/e2e/budget/test_global_ledger.py on Redis (where the two are also run side by
side on random report sequences and must answer the same leases).
"""

from __future__ import annotations

import uuid

import pytest

from budget.global_ledger import GlobalLedger, InProcessGlobalLedger, RedisGlobalLedger
from budget.leases import Lease, LeaseSettings, PoolRoom, Report, TenantReport
from budget.redis_store import connect
from tests.support.clock import VirtualClock

SETTINGS = LeaseSettings(lease_s=10.0, fallback_for_s=30.0, min_share=0.05)
DAY = "day:2026-12-05"

__all__ = [
    "clock",
    "test_a_moved_tenant_gets_its_limit_in_the_new_region",
    "test_a_replayed_or_late_report_changes_nothing_and_grants_nothing",
    "test_a_silent_region_keeps_its_hold_then_its_fallback_then_nothing",
    "test_shares_by_demand_and_peers_with_their_pools",
    "test_spend_ceilings_stop_at_the_limit",
]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def open_ledger(
    request: pytest.FixtureRequest,
    kind: str,
    clock: VirtualClock,
    settings: LeaseSettings = SETTINGS,
) -> GlobalLedger:
    """A global ledger of `kind`: memory or redis (keys of its own on the session's server)."""
    if kind == "memory":
        return InProcessGlobalLedger(settings, clock)
    port = request.getfixturevalue("redis_port")
    return RedisGlobalLedger(
        connect(f"redis://127.0.0.1:{port}"),
        settings,
        timeout_s=5.0,
        clock=clock,
        prefix=f"slogate:global:{uuid.uuid4().hex[:8]}",
    )


def line(
    demand: float,
    applied: float = 0.0,
    usage: float = 0.0,
    spent: float = 0.0,
    limit: float | None = None,
    ceiling: float | None = None,
    tenant: str = "acme",
) -> TenantReport:
    return TenantReport(
        tenant,
        demand,
        usage,
        {DAY: spent},
        applied,
        {} if limit is None else {DAY: limit},
        {} if ceiling is None else {DAY: ceiling},
    )


def report(region: str, seq: int, *lines: TenantReport, level: int = 0) -> Report:
    return Report(region, seq, lines, {"chat": PoolRoom(level, waiting_full=level >= 2)})


def share(lease: Lease, tenant: str = "acme") -> float:
    return lease.tenants[tenant].share


async def test_shares_by_demand_and_peers_with_their_pools(
    ledger: GlobalLedger, clock: VirtualClock
) -> None:
    first = await ledger.report(report("eu", 1, line(300), level=2))
    assert (first.region, first.seq, first.lease_s, share(first), first.peers) == (
        "eu",
        1,
        10.0,
        1.0,
        {},
    )
    us = await ledger.report(report("us", 1, line(100), level=0))
    assert share(us) == 0.0  # eu holds everything until its next report
    assert us.peers == {"eu": {"chat": PoolRoom(2, True)}}
    clock.advance(1.0)
    eu = await ledger.report(report("eu", 2, line(300, applied=1.0)))
    assert share(eu) == pytest.approx(0.05 + 0.9 * 0.75)
    assert eu.rebalanced == 1
    # us missed a report: its demand counts half at eu's next; eu then holds the larger
    # share until it reports having applied the smaller one.
    for seq in (3, 4, 5):
        clock.advance(1.0)
        eu = await ledger.report(report("eu", seq, line(300, applied=share(eu))))
        us = await ledger.report(report("us", seq - 1, line(100)))
    assert share(us) == pytest.approx(0.05 + 0.9 * 0.25)
    assert share(eu) + share(us) <= 1.0 + 1e-9


async def test_a_replayed_or_late_report_changes_nothing_and_grants_nothing(
    ledger: GlobalLedger, clock: VirtualClock
) -> None:
    await ledger.report(report("eu", 5, line(10, usage=100.0, spent=2.0)))
    await ledger.report(report("us", 1, line(10, usage=50.0, spent=1.0)))
    clock.advance(1.0)
    for seq in (5, 4, 0):  # a replay, a late one, a restarted holder starting from 0
        stale = await ledger.report(report("eu", seq, line(10, usage=999.0, spent=99.0)))
        assert (stale.seq, stale.lease_s, stale.rebalanced) == (5, 0.0, 0)
        assert stale.tenants["acme"].global_usage == 150.0
        assert stale.tenants["acme"].global_spend == {DAY: 3.0}
    fresh = await ledger.report(report("eu", 6, line(10, usage=120.0, spent=2.5)))
    assert fresh.tenants["acme"].global_usage == 170.0  # stored, not added
    assert fresh.tenants["acme"].global_spend == {DAY: 3.5}


async def test_a_silent_region_keeps_its_hold_then_its_fallback_then_nothing(
    ledger: GlobalLedger, clock: VirtualClock
) -> None:
    await ledger.report(report("eu", 1, line(100)))  # eu holds 1.0, then falls silent
    clock.advance(9.0)
    assert share(await ledger.report(report("us", 1, line(100)))) == 0.0
    clock.advance(1.5)  # eu's lease is over: its fallback (the share it held) for 30 s
    assert share(await ledger.report(report("us", 2, line(100)))) == 0.0
    clock.advance(30.0)
    back = await ledger.report(report("us", 3, line(100)))
    assert share(back) == 1.0
    assert back.peers == {}


async def test_spend_ceilings_stop_at_the_limit(ledger: GlobalLedger, clock: VirtualClock) -> None:
    held = {"eu": 0.0, "us": 0.0}
    ceiling = {"eu": 0.0, "us": 0.0}
    spent = {"eu": 0.0, "us": 0.0}

    async def turn(region: str, seq: int) -> None:
        clock.advance(0.5)
        lease = await ledger.report(
            report(region, seq, line(1, held[region], 0, spent[region], 100.0, ceiling[region]))
        )
        held[region] = share(lease)
        ceiling[region] = lease.tenants["acme"].spend_ceiling[DAY]

    for seq in range(1, 4):
        await turn("eu", seq)
        await turn("us", seq)
    assert held == {"eu": 0.5, "us": 0.5}
    assert ceiling == {"eu": 50.0, "us": 50.0}
    spent = dict(ceiling)  # both spend all of it before either reports
    await turn("eu", 4)
    await turn("us", 4)
    assert ceiling == {"eu": 50.0, "us": 50.0}


async def test_a_moved_tenant_gets_its_limit_in_the_new_region(
    ledger: GlobalLedger, clock: VirtualClock
) -> None:
    applied = {"a": 0.0, "b": 0.0}
    seq = {"a": 0, "b": 0}

    async def round_(demand: dict[str, float]) -> None:
        for region in ("b", "a"):
            clock.advance(0.5)
            seq[region] += 1
            lease = await ledger.report(
                report(region, seq[region], line(demand[region], applied[region]))
            )
            applied[region] = share(lease)

    for _ in range(5):
        await round_({"a": 1000.0, "b": 0.0})
    for _ in range(7):  # MOVE_REPORTS
        await round_({"a": 0.0, "b": 1000.0})
    assert applied["b"] >= 0.9
    assert applied["a"] + applied["b"] <= 1.0 + 1e-9
