"""A global tenant's budgets in one region: its limits times the region's share, its spend
window's limit the region's ceiling, its demand and usage counted; a region-scope tenant
as before (a global scope needs `regions:`: the policy refuses it without)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pytest

from admission.budget_step import BudgetStep, effective_limits
from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited, SpendExhausted
from admission.events import NoEvents
from admission.spend_step import SpendStep
from budget.region_demand import Flushed, RegionDemand
from budget.spend_store import InProcessSpendStore
from budget.store import InProcessStore
from policy.domain import ApiKey, ContextBucket, Limits, Tier
from policy.loader import parse_policy
from policy.schema import Policy

NOW_S = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC).timestamp()
REGIONS = {
    "this": "eu",
    "list": {"eu": {}, "us": {}},
    "ledger": {"url": "redis://127.0.0.1:1/0"},
}
TENANTS = {
    "prices": {"tokens": {"prompt": 1, "cached_prompt": 1, "completion": 1, "reasoning": 1}},
    "list": {
        "acme": {"scope": "global", "spend": {"per_day": 10_000}},
        "local": {"spend": {"per_day": 10_000}},
    },
}
POLICY = parse_policy({"regions": REGIONS, "tenants": TENANTS, "keys": []})
LIMITS = Limits(tokens_per_minute=10_000, requests_per_minute=100)


class Shares:
    """What the region agent answers (extproc.runtime.region_agent.RegionAgent)."""

    def __init__(self, share: float, ceilings: Mapping[str, float] | None = None) -> None:
        self.value = share
        self.ceilings = ceilings or {}

    def share(self, tenant: str) -> float | None:
        return self.value

    def spend_limit(self, tenant: str, window_id: str, limit: float) -> float | None:
        return self.ceilings.get(window_id)

    async def first_lease(self, tenant: str, wait_s: float) -> None:
        self.waited = wait_s


def decision(tenant: str, prompt: int = 1000, max_tokens: int = 500) -> RoutingDecision:
    return RoutingDecision(
        request_id=tenant,
        caller=ApiKey(tenant[0] * 64, tenant, Tier.STANDARD, LIMITS),
        pool="default",
        bucket=ContextBucket("short", 0, None, 1.0),
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        estimate=CountKind.EXACT,
        stream=True,
    )


@pytest.mark.parametrize(
    ("policy", "tenant", "expected"),
    [
        (POLICY, "acme", Limits(tokens_per_minute=2_500, requests_per_minute=25)),
        (POLICY, "local", LIMITS),  # its scope is the region: its whole limits here
    ],
)
def test_a_global_tenant_s_limits_are_its_region_s_share(
    policy: Policy, tenant: str, expected: Limits
) -> None:
    limits = effective_limits(decision(tenant), policy, {}, None, Shares(0.25))
    assert limits == expected


async def test_demand_counts_reserved_and_refused_usage_what_settled() -> None:
    demand = RegionDemand()
    gate = BudgetStep(InProcessStore(), NoEvents(), 60, shares=Shares(0.25), demand=demand)
    admitted = await gate.admit(Applicant(decision("acme"), "a", POLICY))  # 1500 of 2500
    with pytest.raises(RateLimited):
        await gate.admit(Applicant(decision("acme"), "b", POLICY))  # refused: demand too
    await gate.admit(Applicant(decision("local"), "c", POLICY))  # not global: not counted
    await gate.settle(
        RequestOutcome(admitted.decision, "a", 200, 1000, 200, 0.1, 1.0, "via_upstream")
    )
    assert demand.take() == {"acme": Flushed(demand=3000.0, usage=1200.0)}


async def test_no_share_refuses_a_global_tenant_and_says_why() -> None:
    demand = RegionDemand()
    gate = BudgetStep(InProcessStore(), NoEvents(), 60, shares=Shares(0.0), demand=demand)
    with pytest.raises(RateLimited) as info:
        await gate.admit(Applicant(decision("acme"), "a", POLICY))
    assert info.value.reason == "budget_region_share"
    assert info.value.retry_after_s == 1  # the report interval
    assert demand.take()["acme"].demand == 1500.0  # it still asked
    await gate.admit(Applicant(decision("local"), "b", POLICY))  # the region's own: as before


async def test_a_global_spend_window_is_limited_at_the_region_s_ceiling() -> None:
    day = "day:2026-12-05"
    spending = SpendStep(
        InProcessSpendStore(lambda: NOW_S),
        NoSpendEvents(),
        600,
        lambda: NOW_S,
        Shares(1, {day: 2000}),
    )
    for rid in ("a", "b"):  # 1500, then 3000 of the 2000: the last one admitted passes it
        await spending.admit(Applicant(decision("acme"), rid, POLICY))
    with pytest.raises(SpendExhausted):
        await spending.admit(Applicant(decision("acme"), "c", POLICY))
    for rid in ("d", "e", "f"):  # the region-scope tenant: its whole 10,000 here
        await spending.admit(Applicant(decision("local"), rid, POLICY))


class NoSpendEvents:
    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None: ...
    def spend_unverified(self, tenant: str, action: str, cause: str) -> None: ...
    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None: ...
