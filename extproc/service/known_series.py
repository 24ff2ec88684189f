"""The series a policy makes known, exported at zero from the start.

Prometheus has no series for a label set until it is first used, so on a quiet, healthy
stack `rate()` over the waiting room, the capacity refusals or the Redis decisions returned
nothing at all (5 of the dashboard's 25 queries), which a dashboard cannot tell from a broken
scrape. A counter at 0 says "nothing happened"; `sum(rate(...))` of it is 0.

What lives here: `start_series` (once, when the sidecar is built: the stores' series, the
breakers' signals) and `policy_series` (at start and after every reload: what the policy's
pools and the tiers make known), and `held_by_pool` / `waiting_by_pool` for the gauges read
at scrape time. Only small bounded sets belong here: never tenants (their series are capped
by their own module), never engines (the fleet collector lists every engine it knows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from extproc.service.metrics import SidecarMetrics
from policy.domain import Tier
from policy.schema import GLOBAL_BREAKER, BudgetStoreKind, Policy

# The refusals that say a pool is full (admission.kv.step, .dispatch): what SlogatePoolFull counts.
CAPACITY_REASONS = ("kv_cache_full", "sequences_full", "queue_full", "queue_timeout")
# How a request leaves the waiting room (admission.kv.step, .dispatch; MetricsEvents.waited).
WAIT_OUTCOMES = ("dispatched", "timed_out", "full", "cancelled")
# What the breaker does to a request it does not admit as is (breaker.shedding).
SHED_REASONS = ("long_context_shed", "tier_shed", "context_capped", "fallback")
CODE_CLASSES = ("2xx", "4xx", "5xx", "other")
STORES = ("shared", "local")
# What the breaker loop exports per pool (extproc.runtime.loops.BreakerLoop.export).
BREAKER_SIGNALS = (
    "p99_over_slo",
    "error_rate",
    "kv_cache_usage",
    "gpu_memory_usage",
    "queue_ratio",
)

K = TypeVar("K")


def start_series(metrics: SidecarMetrics, policy: Policy) -> None:
    """The series of a sidecar being built, before its loops first run: the budget store's,
    the breakers' signals (NaN: no data yet), the critical tier's wait alert bound (read
    at start, as the alert rules are rendered) and `policy_series`.

    Without a shared store there is no Redis to be up or down: its gauges are dropped, as a
    0 there read "degraded" and fired SlogateRedisDegraded on every single-replica stack."""
    if policy.budget.store is BudgetStoreKind.REDIS:
        for store in STORES:
            metrics.budget_store_decisions(store)
            metrics.kv_ledger_decisions(store)
    else:
        metrics.registry.unregister(metrics.redis_up)
        metrics.registry.unregister(metrics.kv_ledger_shared)
    # No key with a tokens-per-minute limit has been stepped yet: no factor (not 0).
    metrics.quotas.safety_factor.set(math.nan)
    for result in ("ok", "rejected"):
        metrics.policy_reloads(result)
    # Only here: a reload must not overwrite what the breaker loop read since.
    for pool in (*policy.pools, GLOBAL_BREAKER):
        for signal in BREAKER_SIGNALS:
            metrics.breaker_signal(pool, signal).set(math.nan)
    metrics.wait_alert_bound(Tier.CRITICAL.value).set(policy.waiting_room.alert_critical_p99_wait_s)
    policy_series(metrics, policy)


def policy_series(metrics: SidecarMetrics, policy: Policy) -> None:
    """Every bounded label set the policy makes known, at 0 where it does not exist yet.

    Touching a child that exists changes nothing, so this runs again after each reload
    (a new pool gets its series); a pool a reload removed keeps its last values."""
    tiers = [tier.value for tier in Tier]
    for reason in CAPACITY_REASONS:
        metrics.rejections(reason, "503")
    for tier in tiers:
        metrics.wait_seconds(tier)
        for outcome in WAIT_OUTCOMES:
            metrics.wait_outcomes(tier, outcome)
        for reason in SHED_REASONS:
            metrics.shed(tier, reason)
        for direction in ("shrink", "grow"):
            metrics.quotas.quota_adjustments(tier, direction)
    for pool in (*policy.pools, GLOBAL_BREAKER):
        metrics.breaker_level(pool)  # a pool starts at L0, undrilled
        metrics.breaker_drill(pool)
    for pool in policy.pools:
        metrics.breaker_probes(pool)
        metrics.usage_missing(pool)
        for code_class in CODE_CLASSES:
            metrics.responses(pool, code_class)


def held_by_pool(
    held: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]],
    policy: Callable[[], Policy],
) -> Callable[[], tuple[dict[str, int], dict[str, int]]]:
    """What admission holds per pool (KV tokens, requests), 0 for every pool it counts for
    (those with kv_capacity_tokens or max_num_seqs) that holds nothing."""

    def read() -> tuple[dict[str, int], dict[str, int]]:
        tokens, sequences = held()
        pools = [
            name
            for name, pool in policy().pools.items()
            if pool.kv_capacity_tokens is not None or pool.max_num_seqs is not None
        ]
        return zero_filled(tokens, pools), zero_filled(sequences, pools)

    return read


def waiting_by_pool(
    counts: Callable[[], Mapping[tuple[str, Tier], int]], policy: Callable[[], Policy]
) -> Callable[[], dict[tuple[str, str], int]]:
    """Requests in the waiting room per (pool, tier), 0 for every pool and tier of the policy."""

    def read() -> dict[tuple[str, str], int]:
        waiting = {(pool, tier.value): n for (pool, tier), n in counts().items()}
        return zero_filled(waiting, ((p, t.value) for p in policy().pools for t in Tier))

    return read


def zero_filled(counts: Mapping[K, int], keys: Iterable[K]) -> dict[K, int]:
    """`counts` with every one of `keys` present (0 where missing): a scrape-time gauge
    shows the known pools while they hold nothing."""
    filled = dict.fromkeys(keys, 0)
    filled.update(counts)
    return filled
