"""The region agent: two regions' budget steps sharing a global tenant's limit by lease, a
tenant moving between them, a partition from the global ledger (its valkey SIGSTOPped)
and its heal, the region's replicas sharing one lock and one lease, a reload.

The regions' leases run on a virtual clock (the agents' and, where in-process, the
ledger's): what takes lease_s or fallback_for_s takes one step here. The regional stores
and the partitioned ledger are real valkeys (the session's; the ledger's own, which this
file stops and continues)."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from admission.budget_step import BudgetStep
from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited, SpendExhausted
from admission.events import NoEvents
from admission.spend_step import SpendStep
from budget.global_ledger import GlobalLedger, InProcessGlobalLedger
from budget.leases import MOVE_REPORTS, LeaseSettings
from budget.redis_store import connect
from budget.region_demand import Flushed, RegionDemand
from budget.spend_store import InProcessSpendStore
from budget.store import InProcessStore
from extproc.adminpb import admin_pb2 as pb
from extproc.runtime.processes import ManagedProcess
from extproc.runtime.region_agent import RegionAgent, redis_ledger
from extproc.runtime.region_store import InProcessRegionStore, RedisRegionStore, RegionStore
from extproc.service.admin_client import status_table
from extproc.service.tenant_series import TenantSeries
from policy._regions import LedgerConfig
from policy.domain import ApiKey, ContextBucket, Limits, Tier
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.in_process import in_process
from tests.support.stack import example_policy, write_policy
from tooling.stack.redis import start_redis

NOW_S = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC).timestamp()
LIMIT = 60_000  # acme's tokens per minute, worldwide
CHARGE = 1500.0  # one request's weighted tokens (decision below)
SPEND = 30_000  # acme's spend budget per day, worldwide (token-equivalents at price 1)


def policy(this: str = "eu", url: str = "redis://127.0.0.1:1/0", **ledger: Any) -> Policy:
    return parse_policy(
        {
            "regions": {
                "this": this,
                "list": {"eu": {}, "us": {}},
                "ledger": {"url": url, "fallback_for_s": 60, **ledger},
            },
            "tenants": {
                "prices": {
                    "tokens": {"prompt": 1, "cached_prompt": 1, "completion": 1, "reasoning": 1}
                },
                "list": {
                    "acme": {
                        "scope": "global",
                        "limits": {"tokens_per_minute": LIMIT},
                        "spend": {"per_day": SPEND},
                    },
                    "local": {"limits": {"tokens_per_minute": LIMIT}},  # its region's own
                },
            },
            "keys": [],
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def decision(tenant: str) -> RoutingDecision:
    return RoutingDecision(
        request_id=tenant,
        caller=ApiKey(tenant[0] * 64, tenant, Tier.STANDARD, Limits(tokens_per_minute=LIMIT)),
        pool="default",
        bucket=ContextBucket("short", 0, None, 1.0),
        prompt_tokens=1000,
        max_tokens=500,
        estimate=CountKind.EXACT,
        stream=True,
    )


class Region:
    """One replica of a region: its agent, and its budget step reading the agent's shares."""

    def __init__(
        self,
        name: str,
        store: RegionStore,
        ledger: Callable[[LedgerConfig], GlobalLedger],
        clock: Clock,
        current: Callable[[], Policy],
        pinned: bool = True,
    ) -> None:
        """`pinned`: `name` as `slogate serve --region` gives it; else the policy's."""
        self.clock = clock
        self.registry = CollectorRegistry()
        self.spend_store = InProcessSpendStore(lambda: NOW_S)
        self.agent = RegionAgent(
            policy=current,
            store=store,
            demand=RegionDemand(),
            registry=self.registry,
            tenants=TenantSeries(),
            clock=clock,
            wall_clock=lambda: NOW_S,
            spend=self.spend_store,
            region=name if pinned else None,
            ledger=ledger,
        )
        self.current = current
        self.budgets = BudgetStep(
            InProcessStore(clock), NoEvents(), 600, shares=self.agent, demand=self.agent.demand
        )
        self.spending = SpendStep(self.spend_store, NoSpendEvents(), 600, lambda: NOW_S, self.agent)
        self._ids = 0

    async def spend(self) -> bool:
        """One request of acme against its spend budget (settled at what it reserved)."""
        self._ids += 1
        try:
            admitted = await self.spending.admit(
                Applicant(decision("acme"), f"s{self._ids}", self.current())
            )
        except SpendExhausted:
            return False
        outcome = RequestOutcome(
            admitted.decision, f"s{self._ids}", 200, 1000, 500, 0.1, 1.0, "via_upstream"
        )
        await self.spending.settle(outcome)
        return True

    async def ask(self, tenant: str = "acme") -> bool:
        """One request of `tenant`: admitted, or refused for its budget."""
        self._ids += 1
        try:
            await self.budgets.admit(Applicant(decision(tenant), f"r{self._ids}", self.current()))
        except RateLimited:
            return False
        return True

    async def burst(self, tenant: str = "acme") -> int:
        """Requests admitted until the first refusal."""
        admitted = 0
        while await self.ask(tenant):
            admitted += 1
        return admitted

    def share(self, tenant: str = "acme") -> float:
        share = self.agent.share(tenant)
        assert share is not None
        return share


def in_process_regions(clock: Clock) -> tuple[Region, Region]:
    """eu and us, each its own in-process store, one in-process global ledger."""
    shared: list[InProcessGlobalLedger] = []

    def ledger(config: LedgerConfig) -> GlobalLedger:
        if not shared:
            shared.append(InProcessGlobalLedger(LeaseSettings.of(config), clock))
        return shared[0]

    current = policy()
    return tuple(  # type: ignore[return-value]
        Region(name, InProcessRegionStore(), ledger, clock, lambda: current)
        for name in ("eu", "us")
    )


async def rounds(regions: tuple[Region, ...], count: int, step_s: float = 1.0) -> None:
    for _ in range(count):
        for region in regions:
            await region.agent.step()
        # Never more than the one global limit (replicas of one region count once).
        shares = {r.agent.view().region: r.agent.share("acme") or 0.0 for r in regions}  # type: ignore[union-attr]
        assert sum(shares.values()) <= 1.0 + 1e-9, shares
        for region in regions:
            region.clock.now_s += step_s / len(regions)


async def test_a_global_limit_is_split_by_shares_across_two_regions_budget_steps() -> None:
    clock = Clock()
    eu, us = in_process_regions(clock)
    for region in (eu, us):
        assert not await region.ask()  # no lease names acme yet: no share, refused
    for _ in range(4):  # both regions ask as much
        for region in (eu, us):
            await region.ask()
        await rounds((eu, us), 1)
    for _ in range(90):  # past a minute, the same demand in both: the buckets refill
        for region in (eu, us):
            region.agent.demand.asked("acme", CHARGE)
        await rounds((eu, us), 1)
    assert eu.share() == pytest.approx(0.5) and us.share() == pytest.approx(0.5)
    half = LIMIT / 2 / CHARGE  # 20 requests each, 40 together: the global limit
    assert await eu.burst() == half and await us.burst() == half
    # A region-scope tenant has its whole limit in each region.
    assert await eu.burst("local") == LIMIT / CHARGE == await us.burst("local")


async def test_a_tenant_moving_to_the_other_region_gets_its_budget_back_in_a_few_reports() -> None:
    clock = Clock()
    eu, us = in_process_regions(clock)
    for _ in range(10):  # acme in eu only
        await eu.ask()
        await rounds((eu, us), 1)
    assert eu.share() > 0.9 and us.share() < 0.1
    moved = 0
    while us.share() < 0.9:  # then in us only
        await us.ask()
        await rounds((eu, us), 1)
        moved += 1
        assert moved <= MOVE_REPORTS, f"{us.share():.2f} of the limit after {moved} reports"


async def test_a_global_spend_budget_is_split_by_ceilings_that_never_sum_past_it() -> None:
    clock = Clock()
    eu, us = in_process_regions(clock)
    await rounds((eu, us), 2)
    spent = 0
    for _ in range(30):  # both regions spend, each up to its ceiling
        for region in (eu, us):
            spent += await region.spend()
        await rounds((eu, us), 1)
    day = "day:2026-12-05"
    ceilings = [r.agent.spend_limit("acme", day, SPEND) or 0.0 for r in (eu, us)]
    # A region's limit is its ceiling, or what it spent once a last request took it past
    # (a window admits while under its limit): one request each past the budget at most.
    assert sum(ceilings) <= SPEND + 2 * CHARGE, ceilings
    assert spent * CHARGE <= SPEND + 2 * CHARGE
    assert spent * CHARGE >= SPEND - 2 * CHARGE  # and the budget is not stranded


@pytest.fixture
def global_valkey(tmp_path: Path) -> Iterator[tuple[ManagedProcess, int]]:
    """The global ledger's own valkey: this test stops and continues it."""
    proc, port = start_redis(tmp_path, "global-ledger")
    yield proc, port
    proc.signal(signal.SIGCONT)
    proc.stop()


@pytest.fixture
async def regional(redis_port: int) -> AsyncIterator[Any]:
    client = connect(f"redis://127.0.0.1:{redis_port}/0", socket_timeout_s=None)
    # This file's keys alone: the regions' hash tags.
    for region in ("eu", "us"):
        keys = await client.keys(f"slogate:region:{{{region}}}:*")
        if keys:
            await client.delete(*keys)
    yield client
    await client.aclose()


async def test_a_partition_cuts_a_region_off_then_back_with_nothing_counted_twice(
    global_valkey: tuple[ManagedProcess, int], regional: Any
) -> None:
    ledger_proc, port = global_valkey
    current = policy(url=f"redis://127.0.0.1:{port}/0", timeout_ms=200)
    clock = Clock()
    eu, us = (
        Region(name, RedisRegionStore(regional, 1.0), redis_ledger, clock, lambda: current)
        for name in ("eu", "us")
    )
    settled = {"eu": 0.0, "us": 0.0}

    async def serve(count: int) -> None:
        """Each region settles 100 weighted tokens of acme per round (its budget step's
        count), and reports."""
        for _ in range(count):
            for name, region in (("eu", eu), ("us", us)):
                region.agent.demand.asked("acme", 100.0)
                region.agent.demand.settled("acme", 100.0)
                settled[name] += 100.0
            await rounds((eu, us), 1)

    try:
        await serve(4)
        assert eu.agent.view().state == "leased"  # type: ignore[union-attr]
        before = eu.share()
        ledger_proc.signal(signal.SIGSTOP)  # its socket hangs, as a cut link does
        await serve(1)
        view = eu.agent.view()
        assert view is not None and view.state == "cut_off" and eu.share() == before
        clock.now_s += 10.0  # past lease_s: the fallback, its last share (fallback_share last)
        await serve(1)
        assert eu.agent.view().state == "fallback" and eu.share() == before  # type: ignore[union-attr]
        clock.now_s += 60.0  # past fallback_for_s: closed
        await serve(1)
        assert eu.agent.view().state == "closed" and eu.share() == 0.0  # type: ignore[union-attr]
        assert not await eu.ask()
        assert await eu.ask("local")  # the region's own tenants never notice
        text = generate_latest(eu.registry).decode()
        assert 'slogate_region_ledger_state{state="closed"} 1.0' in text
    finally:
        ledger_proc.signal(signal.SIGCONT)
    for _ in range(4):  # a late report of the partition may land first: it changes nothing
        await serve(1)
        if eu.agent.view().state == "leased" == us.agent.view().state:  # type: ignore[union-attr]
            break
    await rounds((eu, us), 1)  # each region's lease after both reported all they settled
    for region in (eu, us):
        view = region.agent.view()
        assert view is not None and view.state == "leased"
        (acme,) = [t for t in view.tenants if t.tenant == "acme"]
        # Every region's cumulative usage, stored not added: each settled token once.
        assert acme.global_usage == pytest.approx(settled["eu"] + settled["us"])
        assert region.share() > 0.0


def newcomers_policy(**ledger: Any) -> Policy:
    """Every tenant the policy does not list is global (keys made at run time, say)."""
    return parse_policy(
        {
            "regions": {
                "this": "eu",
                "list": {"eu": {}, "us": {}},
                "ledger": {"url": "redis://127.0.0.1:1/0", **ledger},
            },
            "tenants": {"defaults": {"scope": "global"}, "list": {"local": {}}},
            "keys": [],
        }
    )


@pytest.mark.parametrize("steps", [True, False])
async def test_a_tenant_new_to_the_region_waits_for_its_first_lease_not_a_429(
    steps: bool,
) -> None:
    """No lease names a tenant new to the region: its request waits for the next one (its
    demand goes out with the next report) instead of a 429; refused only if that lease
    does not come within two intervals and a report's timeout."""
    clock = Clock()
    current = newcomers_policy(report_interval_s=0.1, lease_s=1.0, timeout_ms=50)
    ledgers: list[InProcessGlobalLedger] = []

    def ledger(config: LedgerConfig) -> GlobalLedger:
        ledgers.append(InProcessGlobalLedger(LeaseSettings.of(config), clock))
        return ledgers[0]

    eu = Region("eu", InProcessRegionStore(), ledger, clock, lambda: current)
    await eu.agent.step()
    assert eu.agent.share("newco") == 0.0  # the lease names nobody yet
    asking = asyncio.create_task(eu.ask("newco"))
    await asyncio.sleep(0.05)
    assert not asking.done()  # waiting, not refused
    if steps:
        clock.now_s += 0.1
        await eu.agent.step()  # its demand went out with this report: the lease names it
        assert eu.agent.share("newco") == 1.0
    assert await asyncio.wait_for(asking, 5.0) is steps


async def test_a_batch_sent_again_after_a_timeout_is_added_once(regional: Any) -> None:
    """A flush that timed out may have landed: the replica sends the same batch again, and
    the region's store adds it once (given back into the next batch, it counted twice)."""
    store = RedisRegionStore(regional, 1.0)
    batch = {"acme": Flushed(demand=100.0, usage=80.0)}
    await store.flush("eu", batch, "replica-1:1")
    await store.flush("eu", batch, "replica-1:1")  # the same batch, sent again
    await store.flush("eu", {"acme": Flushed(demand=5.0, usage=4.0)}, "replica-1:2")
    await store.flush("eu", batch, "replica-2:1")  # another replica's first batch
    totals = await store.take("eu")
    assert totals.demand == {"acme": 205.0}
    assert totals.usage == {"acme": 164.0}


async def test_one_replica_reports_for_its_region_and_the_others_read_its_lease(
    regional: Any,
) -> None:
    clock = Clock()
    shared: list[InProcessGlobalLedger] = []

    def ledger(config: LedgerConfig) -> GlobalLedger:
        if not shared:
            shared.append(InProcessGlobalLedger(LeaseSettings.of(config), clock))
        return shared[0]

    current = [policy(report_interval_s=0.1, lease_s=1.0)]
    first, second = (
        Region("eu", RedisRegionStore(regional, 1.0), ledger, clock, lambda: current[0], False)
        for _ in range(2)
    )
    await rounds((first, second), 2, 0.1)
    assert first.agent.holds_lock != second.agent.holds_lock
    holder, reader = (first, second) if first.agent.holds_lock else (second, first)
    assert reader.share() == holder.share() > 0.0
    seq = holder.agent.view().seq  # type: ignore[union-attr]
    await asyncio.sleep(0.35)  # the holder stops: its lock (3 intervals) lapses
    await rounds((reader,), 1, 0.1)
    view = reader.agent.view()
    assert view is not None and view.holder and view.seq == seq + 1 and view.state == "leased"
    # A reload of the ledger's settings keeps the lease; one that moves the replica to
    # another region starts it over there.
    share = reader.share()
    current[0] = policy(report_interval_s=0.1, lease_s=2.0)
    assert reader.share() == share and reader.agent.view().state == "leased"  # type: ignore[union-attr]
    current[0] = policy("us", report_interval_s=0.1, lease_s=1.0)
    await rounds((reader,), 1, 0.1)
    moved = reader.agent.view()
    assert moved is not None and moved.region == "us" and moved.state == "leased"


def test_status_shows_the_region_its_state_and_each_global_tenant() -> None:
    reply = pb.StatusReply()
    reply.region.region = "eu"
    reply.region.ledger_state = "fallback"
    reply.region.seq = 12
    reply.region.lease_expires_in_s = -4.0
    reply.region.tenants.add(tenant="acme", share=0.25, usage=1200, global_usage=4800)
    text = status_table(reply)
    assert "region eu: fallback (lease #12, lease expired 4.0 s ago" in text
    assert "acme" in text and "0.250" in text and "4800" in text


async def test_a_sidecar_reports_before_it_serves_and_a_reload_without_regions_stops_it(
    tmp_path: Path, redis_port: int
) -> None:
    """The serve wiring: a sidecar with `regions:` has its lease before its first request
    (a global tenant admitted at once), `slogate status` shows the region, and a reload
    without `regions:` leaves its tenants unscaled."""
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False
    raw["regions"] = {
        "this": "eu",
        "list": {"eu": {}, "us": {}},
        "ledger": {"url": f"redis://127.0.0.1:{redis_port}/7"},
    }
    raw["tenants"] = {"defaults": {}, "list": {"demo-standard": {"scope": "global"}}}
    client = connect(f"redis://127.0.0.1:{redis_port}/7", socket_timeout_s=None)
    await client.flushdb()  # this test's database alone
    await client.aclose()
    path = write_policy(tmp_path / "policy.yaml", raw)
    async with in_process(path, exact_tokenizer=False) as (sidecar, driver, _):
        status = await sidecar.control.admin.Status(pb.StatusRequest(), None)  # type: ignore[arg-type]
        assert status.region.region == "eu" and status.region.ledger_state == "leased"
        assert status.region.holder
        assert sidecar.region.share("demo-standard") == 1.0  # the only region reporting
        answer = await driver.decide("sk-demo-standard", chat("hello", 16))
        assert answer.status == 200
        del raw["regions"], raw["tenants"]
        write_policy(path, raw)
        assert await sidecar.policy.reload()
        await sidecar.region.step()
        assert sidecar.region.share("demo-standard") is None
        status = await sidecar.control.admin.Status(pb.StatusRequest(), None)  # type: ignore[arg-type]
        assert not status.HasField("region")


def chat(content: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }


class NoSpendEvents:
    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None: ...
    def spend_unverified(self, tenant: str, action: str, cause: str) -> None: ...
    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None: ...
