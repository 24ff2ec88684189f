"""The shared state the policy asks for, built once at start: budgets and the KV ledger.

What lives here: `build_stores`: with the in-process store, budgets, the KV ledger and the
region's store (extproc.runtime.region_store) live in this process (each of
`budget.replicas` replicas admitting against its part of each pool); with Redis, they are
the fleet's, the budgets and the KV ledger each behind its failover (local shares while
Redis is unreachable, divided by the live replicas' count from their heartbeats), with the
metrics of which one decided. `Stores.leave` takes this replica out of the fleet's count on
the way out, `Stores.close` closes the budgets' connections.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from admission.kv.book import FailoverBook, KvBook, LocalBook
from admission.kv.redis_ledger import FleetMembers, RedisBook
from budget.failover import FailoverStore
from budget.redis_store import RedisStore, connect
from budget.spend_redis import RedisSpendStore
from budget.spend_store import InProcessSpendStore, SpendStore
from budget.store import BudgetStore, InProcessStore
from extproc.runtime.region_store import InProcessRegionStore, RedisRegionStore, RegionStore
from extproc.service.metrics import SidecarMetrics
from policy.schema import BudgetStoreKind, Policy


@dataclass(frozen=True, slots=True)
class Stores:
    budgets: BudgetStore
    kv: KvBook
    members: FleetMembers | None  # None: no shared store, no heartbeats
    # The tenants' spend budgets: this process's, or the fleet's in Redis (no failover).
    spend: SpendStore | None = None
    # The region's demand, usage, lock and lease (extproc.runtime.region_agent): in this
    # process, or the region's Redis (the budgets'), which all its replicas share.
    region: RegionStore | None = None

    @property
    def shared(self) -> bool:
        """The fleet's, in Redis: their round trips wait (and are bounded by timeouts)."""
        return self.members is not None

    async def leave(self) -> None:
        """Out of the fleet's count: the others' local shares grow at once."""
        if self.members is not None:
            await self.members.leave()

    async def close(self) -> None:
        await self.budgets.close()


def build_stores(
    policy: Callable[[], Policy],
    metrics: SidecarMetrics,
    clock: Callable[[], float],
    wall_clock: Callable[[], float] | None = None,
) -> Stores:
    """The stores the policy asks for. Changing them needs a restart, not a reload.
    `clock`: the sidecar's (the local ledger's deadlines); `wall_clock` replaces the
    in-process budget store's wall clock (tests). Redis keeps its own time, which every
    replica shares."""
    initial = policy()
    config = initial.budget
    if config.store is BudgetStoreKind.MEMORY:
        return Stores(
            InProcessStore(wall_clock),
            LocalBook(clock, lambda: policy().budget.replicas),
            None,
            InProcessSpendStore(wall_clock),
            InProcessRegionStore(),
        )

    def on_budget(degraded: bool) -> None:
        metrics.budget_store_decisions("local" if degraded else "shared").inc()
        metrics.redis_up.set(0 if degraded else 1)

    def on_kv(shared: bool) -> None:
        metrics.kv_ledger_decisions("shared" if shared else "local").inc()
        metrics.kv_ledger_shared.set(1 if shared else 0)

    metrics.redis_up.set(1)
    metrics.kv_ledger_shared.set(1)
    # The URL may carry a password: deployments pass it through the environment (a Secret).
    url = os.environ.get("SLOGATE_REDIS_URL") or config.redis_url
    # Every call on this client is bounded by its store's timeout (`Scripts`): redis-py's
    # own per-socket timeouts would only cost each round trip.
    client = connect(url, config.redis_cluster, socket_timeout_s=None)
    timeout_s = config.redis_timeout_ms / 1000.0
    members = FleetMembers(client, lambda: policy().budget.replicas, timeout_s=timeout_s)
    budgets = FailoverStore(
        RedisStore(client, timeout_s=timeout_s),
        InProcessStore(),
        members.live,
        on_decision=on_budget,
    )
    book = FailoverBook(
        RedisBook(
            client, timeout_s=timeout_s, ratio_gap_s=initial.breaker.controller_interval_s * 0.8
        ),
        LocalBook(clock, members.live),
        clock,
        on_decision=on_kv,
    )
    # A spend check's own, longer wait: it has no local share to fall back on.
    spend = RedisSpendStore(client, timeout_s=config.spend_timeout_ms / 1000.0)
    region = RedisRegionStore(client, timeout_s=timeout_s)
    return Stores(budgets, book, members, spend, region)
