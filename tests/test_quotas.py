"""Per-key dynamic budgets: ceilings from consumption, safety under memory pressure, and
the budget gate enforcing them."""

from __future__ import annotations

import pytest

from budget.ledger import Charge
from budget.store import InProcessStore
from extproc.budgeting import BudgetGate
from extproc.errors import RateLimited
from extproc.metrics import SidecarMetrics
from extproc.quotas import KeyQuotas
from extproc.request_flow import RoutingDecision
from extproc.tokens import CountKind
from policy import ApiKey, ContextBucket, Limits, Tier

KEY = ApiKey("aa" * 32, "acme", Tier.STANDARD, Limits(tokens_per_minute=60_000))
FREE = ApiKey("bb" * 32, "free", Tier.STANDARD, Limits())


def test_ceiling_follows_p95_consumption_within_floor_and_limit() -> None:
    quotas = KeyQuotas(interval_s=5.0)
    assert quotas.tokens_per_minute(KEY) is None  # no history yet: no ceiling
    for _ in range(20):
        quotas.observe(KEY.key_id, 1000.0)  # 1000 weighted tokens per 5 s interval
        quotas.step([KEY, FREE], memory_usage=0.2)
    # P95 1000 per interval x 1.3 = 1300 per 5 s = 15,600 per minute.
    assert quotas.tokens_per_minute(KEY) == pytest.approx(15_600)
    assert quotas.tokens_per_minute(FREE) is None  # no policy limit: nothing to scale
    for _ in range(60):
        quotas.step([KEY], memory_usage=0.2)  # idle for 60 intervals
    assert quotas.tokens_per_minute(KEY) == pytest.approx(6_000)  # the 10% floor
    for _ in range(60):
        quotas.observe(KEY.key_id, 50_000.0)
        quotas.step([KEY], memory_usage=0.2)
    assert quotas.tokens_per_minute(KEY) == pytest.approx(60_000)  # the policy limit


def test_safety_factor_shrinks_the_ceiling_under_memory_pressure() -> None:
    quotas = KeyQuotas(interval_s=5.0)
    for _ in range(10):
        quotas.observe(KEY.key_id, 1000.0)
        quotas.step([KEY], memory_usage=0.9)
    assert quotas.safety_factor(KEY) == pytest.approx(1.1)
    assert quotas.lowest_safety_factor() == pytest.approx(1.1)
    assert quotas.tokens_per_minute(KEY) == pytest.approx(1000 * 1.1 * 12)


async def test_budget_gate_enforces_the_ceiling_and_reports_consumption() -> None:
    seen: list[float] = []
    gate = BudgetGate(
        InProcessStore(),
        SidecarMetrics(),
        ttl_s=60,
        ceiling=lambda d: 3000.0,
        on_settled=lambda d, charge: seen.append(charge.weighted_tokens),
    )
    decision = RoutingDecision(
        request_id="r",
        caller=KEY,
        pool="default",
        bucket=ContextBucket("0-4k", 0, 4096, 1.0),
        prompt_tokens=1000,
        max_tokens=1000,
        estimate=CountKind.EXACT,
        stream=False,
    )
    admitted = await gate.admit(decision, "a")  # 2000 of the 3000 ceiling
    assert admitted.response_headers["x-ratelimit-limit-tokens"] == "3000"
    with pytest.raises(RateLimited):
        await gate.admit(decision, "b")  # the policy's 60,000 would have allowed it
    from extproc.accesslog import RequestOutcome

    await gate.record(RequestOutcome(decision, "a", 200, 900, 100, 0.1, 1.0, "via_upstream"))
    assert seen == [1000.0]
    assert Charge(1000.0, 1000).weighted_tokens == seen[0]


def test_a_rising_key_gets_budget_ahead_of_its_history() -> None:
    quotas = KeyQuotas(interval_s=5.0)
    for t in range(30):
        quotas.observe(KEY.key_id, 100.0 + 20.0 * t)  # a class starting: +20 per interval
        quotas.step([KEY], memory_usage=0.2)
    demand = quotas.demand(KEY)
    assert demand is not None
    actual, forecast = demand
    assert actual == pytest.approx((100 + 20 * 29) * 12)
    assert forecast is not None and forecast > actual  # the trend carries it forward
    # Above what P95 x safety of the history alone would allow.
    p95_only = (100 + 20 * 29 - 20 * 0.5) * 1.3 * 12
    ceiling = quotas.tokens_per_minute(KEY)
    assert ceiling is not None and ceiling > p95_only
    assert ceiling == pytest.approx(forecast * 1.3)
    assert quotas.demand(FREE) is None
