"""The budget store the policy asks for, built once at start.

What lives here: `build_store`: the in-process store, or Redis behind the failover store
(local shares while Redis is unreachable), with the metrics of which one decided.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from budget.failover import FailoverStore
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore, InProcessStore
from extproc.service.metrics import SidecarMetrics
from policy import BudgetStoreKind, Policy


def build_store(
    policy: Policy, metrics: SidecarMetrics, clock: Callable[[], float] | None = None
) -> BudgetStore:
    """The budget store the policy asks for. Changing it needs a restart, not a reload.
    `clock` replaces the in-process store's wall clock (tests); Redis keeps wall time, which
    every replica shares."""
    config = policy.budget
    if config.store is BudgetStoreKind.MEMORY:
        return InProcessStore(clock)

    def on_decision(degraded: bool) -> None:
        metrics.budget_store_decisions("local" if degraded else "shared").inc()
        metrics.redis_up.set(0 if degraded else 1)

    metrics.redis_up.set(1)
    # The URL may carry a password: deployments pass it through the environment (a Secret).
    url = os.environ.get("SLOGATE_REDIS_URL") or config.redis_url
    shared = RedisStore(
        connect(url, config.redis_cluster),
        timeout_s=config.redis_timeout_ms / 1000.0,
    )
    return FailoverStore(shared, InProcessStore(), config.replicas, on_decision=on_decision)
