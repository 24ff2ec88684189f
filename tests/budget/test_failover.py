"""Redis failover's arithmetic: the local share of every limit while Redis is away.

Real sidecars sharing one real Redis, and its outages: tests/e2e/budget/test_failover.py."""

from __future__ import annotations

from policy.domain import Limits


def test_local_share_splits_every_limit() -> None:
    from budget.failover import local_share

    share = local_share(Limits(100, 1000, 10_000, 8, 4096), replicas=3)
    assert share == Limits(33, 333, 3333, 2, 4096)
    assert local_share(Limits(1, None, None, 1), replicas=4) == Limits(1, None, None, 1)
