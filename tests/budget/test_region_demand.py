"""A replica's demand and usage of the global tenants between two flushes (pure)."""

from __future__ import annotations

from budget.region_demand import Flushed, RegionDemand


def test_demand_counts_what_was_asked_and_usage_what_settled_until_taken() -> None:
    demand = RegionDemand()
    demand.asked("acme", 1300.0)
    demand.asked("acme", 700.0)  # refused: still what the tenant asked of this region
    demand.settled("acme", 900.0)
    demand.settled("globex", 50.0)  # never asked here: not a global tenant's request
    assert demand.take() == {"acme": Flushed(demand=2000.0, usage=900.0)}
    assert demand.take() == {}


def test_a_flush_that_failed_is_given_back_and_added_to_the_next() -> None:
    demand = RegionDemand()
    demand.asked("acme", 100.0)
    demand.settled("acme", 80.0)
    taken = demand.take()
    demand.asked("acme", 10.0)
    demand.give_back(taken)
    assert demand.take() == {"acme": Flushed(demand=110.0, usage=80.0)}
