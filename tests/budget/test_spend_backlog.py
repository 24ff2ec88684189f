"""The backlog of spend settlements a slow store could not take: retried in order, stopped
at the first failure, bounded in size and in time, each given up counted once."""

from __future__ import annotations

from typing import Any

from budget.spend import SpendHold, windows
from budget.spend_backlog import Drained, PendingSettlement, SpendBacklog
from budget.spend_store import InProcessSpendStore
from budget.store import BudgetStoreError

NOW_S = 1_798_761_600.0  # 2027-01-01 00:00 UTC


class Away(InProcessSpendStore):
    def __init__(self) -> None:
        super().__init__(lambda: NOW_S)
        self.away = True
        self.calls = 0

    async def settle_unverified(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.away:
            raise BudgetStoreError("redis spend_settle_unverified.lua: TimeoutError")
        return await super().settle_unverified(*args, **kwargs)


def pending(rid: str, actual: float, deadline_s: float = NOW_S + 300) -> PendingSettlement:
    spans = windows({"day": 1000.0}, NOW_S)
    hold = SpendHold("acme", spans, {}, 500.0, verified=False)
    return PendingSettlement(hold, rid, actual, deadline_s, 600)


async def test_retried_in_order_and_stopped_at_the_first_failure() -> None:
    store, backlog = Away(), SpendBacklog()
    for rid, actual in (("a", 10.0), ("b", 20.0), ("c", 30.0)):
        backlog.add(pending(rid, actual))
    assert await backlog.drain(store, NOW_S) == Drained(0, 0, 3)
    assert store.calls == 1  # the rest would only wait out the same timeout
    store.away = False
    assert await backlog.drain(store, NOW_S) == Drained(3, 0, 0)
    spans = windows({"day": 1000.0}, NOW_S)
    assert await store.used("acme", [spans[0].id]) == {spans[0].id: 60.0}


async def test_bounded_in_size_and_in_time_each_loss_counted_once() -> None:
    store, backlog = Away(), SpendBacklog(capacity=2)
    backlog.add(pending("old", 1.0))
    backlog.add(pending("soon", 2.0, deadline_s=NOW_S + 1))
    backlog.add(pending("new", 4.0))  # over capacity: the oldest goes
    assert [e.reservation_id for e in backlog] == ["soon", "new"]
    assert await backlog.drain(store, NOW_S + 5) == Drained(0, 2, 1)  # "old", and "soon" late
    assert await backlog.drain(store, NOW_S + 5) == Drained(0, 0, 1)
