"""The region agent: a replica's part in the region's lease of the global budgets.

What lives here: `RegionAgent`, run each `regions.ledger.report_interval_s` by the
sidecar's loops (extproc.runtime.periodic), and the Lease's JSON form in the region's
store. Each interval, on every replica:

1. this replica's demand and usage of the global tenants (budget.region_demand, fed by the
   budget step) are flushed into the region's store (extproc.runtime.region_store: its
   Redis, one transaction of HINCRBYFLOATs; in-process, directly);
2. the replica that holds the region's lock (`SET NX PX` in the region's Redis; with the
   in-process store, the process itself) is the region's **lease holder**: it takes the
   region's demand and usage, reads its spend, reports them to the global ledger
   (budget.global_ledger: RedisGlobalLedger at `regions.ledger.url`; a report unanswered
   within `timeout_ms` is a failure: LeaseHolder.failed) and writes the Lease it gets
   into the region's store;
3. every other replica reads that Lease into its own LeaseHolder (budget.lease_holder),
   which is what admission reads (admission.regions.RegionShares) and what crossing reads
   of the peers' pools (`peers`).

A replica that reads a lease takes it as sent one interval plus one timeout before it read
it (it cannot know when the holder sent it): its lease ends no later than the holder's.

The agent reads the policy each interval: a reload that changes `regions:` (the region,
the ledger's URL or its settings) takes effect at the next one (a new LeaseHolder, a new
ledger connection); a policy without `regions:` stops it. `slogate serve --region NAME`
overrides `regions.this`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from admission.waiting_room import WaitingRoom
from breaker.board import BreakerBoard
from budget.global_ledger import GlobalLedger, RedisGlobalLedger
from budget.lease_holder import LeaseHolder
from budget.leases import Lease, LeaseSettings, PoolRoom, Report, TenantReport
from budget.redis_store import connect
from budget.region_demand import Flushed, RegionDemand
from budget.spend import windows
from budget.spend_store import SpendStore
from budget.store import BudgetStoreError
from extproc.runtime.region_store import LeaseRecord, RegionStore
from extproc.service.region_metrics import RegionMetrics, RegionView, TenantLeaseView
from extproc.service.tenant_series import TenantSeries
from policy._regions import Fallback, LedgerConfig
from policy.domain import BudgetScope, Tier
from policy.schema import Policy

log = logging.getLogger("slogate.regions")

# The lock outlives a few intervals: a holder that misses one keeps it, one that died
# hands it over within this many intervals.
HOLD_INTERVALS = 3


def new_holder(config: LedgerConfig) -> LeaseHolder:
    return LeaseHolder(
        LeaseSettings.of(config), Fallback(config.limits_fallback), Fallback(config.spend_fallback)
    )


def redis_ledger(config: LedgerConfig) -> GlobalLedger:
    # The URL may carry a password: deployments pass it through the environment.
    url = os.environ.get("SLOGATE_GLOBAL_LEDGER_URL") or config.url
    # Every call is bounded by the report's timeout (the ledger's Scripts): no socket
    # timeouts of redis-py's own on top.
    client = connect(url, socket_timeout_s=None)
    return RedisGlobalLedger(client, LeaseSettings.of(config), config.timeout_ms / 1000.0)


def pool_rooms(policy: Policy, board: BreakerBoard, room: WaitingRoom) -> dict[str, PoolRoom]:
    """What this region tells its peers of its pools: each one's breaker level, and whether
    its waiting room is full for any tier (a crossing peer must have room)."""
    bound = policy.waiting_room.max_waiting
    return {
        name: PoolRoom(
            int(board.level(name)), any(room.waiting(name, tier) >= bound for tier in Tier)
        )
        for name in policy.pools
    }


# -- the agent ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Setup:
    """What a change of which rebuilds the agent's holder and ledger."""

    region: str
    ledger: LedgerConfig


class RegionAgent:
    def __init__(
        self,
        *,
        policy: Callable[[], Policy],
        store: RegionStore,
        demand: RegionDemand,
        registry: CollectorRegistry,
        tenants: TenantSeries,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        spend: SpendStore | None = None,
        pools: Callable[[], Mapping[str, PoolRoom]] | None = None,
        region: str | None = None,
        ledger: Callable[[LedgerConfig], GlobalLedger] = redis_ledger,
        holder_id: str | None = None,
    ) -> None:
        """`region`: `slogate serve --region` (None: the policy's `regions.this`);
        `ledger`: the global ledger for the policy's ledger settings (tests pass an
        in-process one); `pools`: what this region says of its pools to its peers;
        `holder_id`: this replica's name in the region's lock."""
        self._policy = policy
        self._store = store
        self.demand = demand
        self._registry = registry
        self._tenants = tenants
        # Registered once regions are on: a one-region sidecar exports none of them.
        self._metrics: RegionMetrics | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self._clock = clock
        self._wall_clock = wall_clock
        self._spend = spend
        self._pools = pools
        self._override = region
        self._new_ledger = ledger
        self.holder_id = holder_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        # The batch being flushed (id, parts) until the region's store took it.
        self._unsent: tuple[str, dict[str, Flushed]] | None = None
        self._batches = 0
        self._setup: _Setup | None = None
        self._holder: LeaseHolder | None = None
        self._ledger: GlobalLedger | None = None
        self._seq = 0  # the latest lease's seq this replica knows
        self._lease: Lease | None = None
        self.holds_lock = False
        # The region's own spend of each global tenant's windows, read each interval.
        self._spent: dict[str, dict[str, float]] = {}
        # The region's cumulative usage per tenant as last reported (the holder's).
        self._usage: dict[str, float] = {}
        # Set (and replaced) at each new lease: requests of a tenant no lease named wait on it.
        self._new_lease = asyncio.Event()

    # -- what admission and crossing read --------------------------------------------------

    def share(self, tenant: str) -> float | None:
        """The tenant's share from the lease; 0 before a lease names the tenant (one
        report's round trip after start, or after the policy made it global): a share
        not granted by the ledger could be the other regions' (budget.lease_holder)."""
        setup = self._ensure()
        holder = self._holder
        if setup is None or holder is None:
            return None
        return holder.share(tenant, self._clock()) or 0.0

    def spend_limit(self, tenant: str, window_id: str, limit: float) -> float | None:
        self._ensure()
        holder = self._holder
        if holder is None:
            return None
        own = self._spent.get(tenant, {}).get(window_id, 0.0)
        return holder.spend_allowance(tenant, window_id, limit, own, self._clock())

    async def first_lease(self, tenant: str, wait_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + wait_s
        while self._holder is not None and self._holder.share(tenant, self._clock()) is None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    await self._new_lease.wait()
            except TimeoutError:
                return

    def _leased(self) -> None:
        """A new lease is in the holder: whoever waits for one looks again."""
        self._new_lease.set()
        self._new_lease = asyncio.Event()

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        """The other live regions' pools, from the latest lease; empty once it is stale
        (past its lease: what the peers said is as old)."""
        holder, lease = self._holder, self._lease
        if holder is None or lease is None:
            return {}
        if holder.state(self._clock()) not in ("leased", "cut_off"):
            return {}
        return lease.peers

    def view(self) -> RegionView | None:
        """The region for `slogate status` (None: one region)."""
        setup, holder = self._setup, self._holder
        if setup is None or holder is None:
            return None
        now_s = self._clock()
        lease = self._lease
        tenants = sorted(set(self._global_tenants()) | set(lease.tenants if lease else ()))
        rows = []
        for tenant in tenants:
            leased = lease.tenants.get(tenant) if lease else None
            rows.append(
                TenantLeaseView(
                    tenant,
                    holder.share(tenant, now_s),
                    self._usage.get(tenant, 0.0),
                    None if leased is None else leased.global_usage,
                )
            )
        state = holder.state(now_s)
        return RegionView(
            setup.region,
            state,
            self.holds_lock,
            self._seq,
            None if state == "none" else holder.expires_in_s(now_s),
            tuple(rows),
        )

    # -- each interval -----------------------------------------------------------------------

    def _meter(self) -> RegionMetrics:
        assert self._metrics is not None  # registered when regions came on
        return self._metrics

    def interval_s(self) -> float:
        return self._policy().regions.ledger.report_interval_s

    async def step(self) -> None:
        setup = self._ensure()
        if setup is None:
            return
        region = setup.region
        policy = self._policy()
        await self._flush(region)
        await self._read_spend(policy)
        try:
            self.holds_lock = await self._store.hold(
                region, self.holder_id, HOLD_INTERVALS * setup.ledger.report_interval_s
            )
        except BudgetStoreError as error:
            log.warning("region %s: the region's store did not answer: %s", region, error)
            self.holds_lock = False
        if self.holds_lock:
            await self._report(policy, setup)
        else:
            await self._read_lease(setup)
        self._export()

    async def close(self) -> None:
        self._replace(None)
        await asyncio.gather(*self._closing)

    def _ensure(self) -> _Setup | None:
        """The holder and ledger for the policy's regions as they are now: rebuilt when a
        reload changed them, dropped when it removed them (None)."""
        regions = self._policy().regions
        setup = None
        if regions.enabled:
            setup = _Setup(self._override or str(regions.this), regions.ledger)
        if setup != self._setup:
            self._replace(setup)
        return setup

    def _replace(self, setup: _Setup | None) -> None:
        """A new holder (and ledger) for `setup`. The same region on the same ledger (a
        reload that changed a setting) keeps its lease, as of when it was sent: its global
        tenants are not refused for a report's round trip. Another region or ledger starts
        with none."""
        old, before, lease = self._setup, self._holder, self._lease
        same = (
            old is not None
            and setup is not None
            and (old.region, old.ledger.url) == (setup.region, setup.ledger.url)
        )
        if same and self._ledger is not None and setup is not None:
            ledger: GlobalLedger | None = self._ledger
        else:
            self._close_ledger()
            ledger = None if setup is None else self._new_ledger(setup.ledger)
            self._seq = 0
            lease = None
        self._setup, self._ledger, self._lease = setup, ledger, lease
        self._holder = None if setup is None else new_holder(setup.ledger)
        if self._holder is not None and before is not None and lease is not None:
            now_s = self._clock()
            self._holder.sent(now_s + before.expires_in_s(now_s) - lease.lease_s)
            self._holder.received(lease)
        if setup is None:
            self.holds_lock = False
            if self._metrics is not None:
                self._metrics.ledger_state("none")
            return
        if self._metrics is None:
            self._metrics = RegionMetrics(self._registry, self._tenants)
        log.info("region %s: leases from the global ledger (new)", setup.region)

    def _close_ledger(self) -> None:
        ledger, self._ledger = self._ledger, None
        if ledger is not None:  # closed off the caller's path (admission may be asking)
            task = asyncio.ensure_future(ledger.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _flush(self, region: str) -> None:
        if self._unsent is None:
            parts = self.demand.take()
            if not parts:
                return
            self._batches += 1
            self._unsent = (f"{self.holder_id}:{self._batches}", parts)
        batch, parts = self._unsent
        try:
            await self._store.flush(region, parts, batch)
        except BudgetStoreError as error:
            # Sent again at the next flush under the same id, until it lands: a timeout
            # may hide a batch that landed, and the store adds a batch once. (Given back
            # into the next batch instead, it was counted twice when it had landed.)
            log.warning("region %s: flush to the region's store failed: %s", region, error)
            return
        self._unsent = None
        self._count_usage(parts)

    def _count_usage(self, parts: Mapping[str, Flushed]) -> None:
        for tenant, part in parts.items():
            if part.usage:
                self._meter().usage(tenant).inc(part.usage)

    def _global_tenants(self) -> list[str]:
        tenants = self._policy().tenants.listed
        return sorted(n for n, t in tenants.items() if t.scope is BudgetScope.GLOBAL)

    async def _read_spend(self, policy: Policy) -> None:
        """The region's spend in each global tenant's windows now (its store is the
        region's): what the holder reports and what a spend limit is measured from."""
        if self._spend is None:
            return
        now_s = self._wall_clock()
        for tenant in self._global_tenants():
            entry = policy.tenants.get(tenant)
            if entry is None or entry.spend is None:
                self._spent.pop(tenant, None)
                continue
            spans = windows(entry.spend.windows(), now_s)
            try:
                used = await self._spend.used(tenant, [s.id for s in spans])
            except BudgetStoreError:
                continue  # the last reading stands
            self._spent[tenant] = dict(used)

    def _spend_limits(self, policy: Policy, tenant: str) -> dict[str, float]:
        entry = policy.tenants.get(tenant)
        if entry is None or entry.spend is None:
            return {}
        return {s.id: s.limit for s in windows(entry.spend.windows(), self._wall_clock())}

    async def _report(self, policy: Policy, setup: _Setup) -> None:
        holder, ledger = self._holder, self._ledger
        assert holder is not None and ledger is not None
        region = setup.region
        try:
            totals = await self._store.take(region)
        except BudgetStoreError as error:
            log.warning("region %s: the region's store did not answer: %s", region, error)
            return
        now_s = self._clock()
        tenants = sorted(set(self._global_tenants()) | set(totals.demand) | set(totals.usage))
        lines = []
        for tenant in tenants:
            self._usage[tenant] = totals.usage.get(tenant, 0.0)
            lines.append(
                TenantReport(
                    tenant=tenant,
                    demand=totals.demand.get(tenant, 0.0),
                    usage=totals.usage.get(tenant, 0.0),
                    spend=self._spent.get(tenant, {}),
                    applied=holder.applied(tenant, now_s),
                    spend_limit=self._spend_limits(policy, tenant),
                    spend_applied=holder.spend_ceilings(tenant, now_s),
                )
            )
        report = Report(
            region,
            max(self._seq, holder.seq) + 1,
            tuple(lines),
            dict(self._pools()) if self._pools else {},
        )
        holder.sent(now_s)
        try:
            async with asyncio.timeout(setup.ledger.timeout_ms / 1000.0):
                lease = await ledger.report(report)
        except Exception as error:  # a timeout, a refused connection, a Redis error
            holder.failed(self._clock())
            log.warning("region %s: report #%d unanswered: %r", region, report.seq, error)
            await self._write(region, None)
            return
        self._meter().report_seconds.observe(max(0.0, self._clock() - now_s))
        holder.received(lease)
        self._seq = max(self._seq, lease.seq)
        self._lease = lease
        self._leased()
        if lease.rebalanced:
            self._meter().rebalances.inc(lease.rebalanced)
        await self._write(region, lease)

    async def _write(self, region: str, lease: Lease | None) -> None:
        """The holder's latest lease for the region's other replicas; after a failure, the
        one before it marked unanswered."""
        answered = lease is not None
        lease = lease or self._lease
        if lease is None:
            return
        try:
            await self._store.put_lease(region, LeaseRecord(lease, answered, self._usage))
        except BudgetStoreError as error:
            log.warning("region %s: the lease could not be stored: %s", region, error)

    async def _read_lease(self, setup: _Setup) -> None:
        holder = self._holder
        assert holder is not None
        try:
            stored = await self._store.lease(setup.region)
        except BudgetStoreError:
            stored = None
        now_s = self._clock()
        if stored is None:
            return
        lease, answered, usage = stored.lease, stored.answered, dict(stored.usage)
        self._usage = usage
        if lease.seq > self._seq:
            # Sent at most an interval and a timeout ago: measured from then, it ends no
            # later than the holder's own.
            late_s = setup.ledger.report_interval_s + setup.ledger.timeout_ms / 1000.0
            holder.sent(now_s - late_s)
            holder.received(lease)
            self._seq = lease.seq
            self._lease = lease
            self._leased()
        elif not answered:
            holder.failed(now_s)

    def _export(self) -> None:
        holder = self._holder
        if holder is None:
            return
        now_s = self._clock()
        self._meter().ledger_state(holder.state(now_s))
        self._meter().expires_in.set(holder.expires_in_s(now_s))
        for tenant in self._global_tenants():
            share = holder.share(tenant, now_s)
            if share is not None:
                self._meter().share(tenant).set(share)
