"""Per-key dynamic budgets: ceilings from consumption, safety under memory pressure, and
the budget gate enforcing them."""

from __future__ import annotations

import pytest

from admission.budget_step import BudgetStep
from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited
from admission.events import NoEvents
from budget.key_quotas import KeyQuotas
from budget.ledger import Charge
from budget.store import InProcessStore
from policy.domain import ApiKey, ContextBucket, Limits, Tier
from policy.loader import parse_policy

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


def test_a_removed_key_takes_its_budget_with_it() -> None:
    """Keys rotated for a year must not leave a year of budgets behind: an interval keeps
    only the budgets of the keys it stepped."""
    other = ApiKey("cc" * 32, "acme", Tier.STANDARD, Limits(tokens_per_minute=60_000))
    quotas = KeyQuotas(interval_s=5.0)
    for _ in range(3):
        quotas.observe(KEY.key_id, 1000.0)
        quotas.observe(other.key_id, 1000.0)
        quotas.step([KEY, other], memory_usage=0.2)
    assert quotas.tokens_per_minute(other) is not None
    quotas.step([KEY], memory_usage=0.2)  # `other` removed by a reload
    assert quotas.tokens_per_minute(other) is None
    assert quotas.tokens_per_minute(KEY) is not None  # the kept key's history stays
    assert quotas.budget_count() == 1


def test_safety_factor_shrinks_the_ceiling_under_memory_pressure() -> None:
    quotas = KeyQuotas(interval_s=5.0)
    for _ in range(10):
        quotas.observe(KEY.key_id, 1000.0)
        quotas.step([KEY], memory_usage=0.9)
    assert quotas.safety_factor(KEY) == pytest.approx(1.1)
    assert quotas.lowest_safety_factor() == pytest.approx(1.1)
    assert quotas.tokens_per_minute(KEY) == pytest.approx(1000 * 1.1 * 12)


class _Ceiling:
    def tokens_per_minute(self, key: ApiKey) -> float | None:
        return 3000.0


class _Settled(NoEvents):
    def __init__(self) -> None:
        self.seen: list[float] = []

    def tokens_settled(self, decision: RoutingDecision, charge: Charge) -> None:
        self.seen.append(charge.weighted_tokens)


@pytest.mark.parametrize("enforced", [True, False])
async def test_the_budget_step_enforces_the_ceiling_when_the_policy_says_so(
    enforced: bool,
) -> None:
    events = _Settled()
    gate = BudgetStep(InProcessStore(), events, ttl_s=60, ceilings=_Ceiling())
    policy = parse_policy({"breaker": {"controller_key_budgets": enforced}})
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
    admitted = await gate.admit(Applicant(decision, "a", policy))  # 2000 of the 3000 ceiling
    if not enforced:  # shown, not enforced: the policy's 60,000 applies
        assert admitted.response_headers["x-ratelimit-limit-tokens"] == "60000"
        return
    assert admitted.response_headers["x-ratelimit-limit-tokens"] == "3000"
    with pytest.raises(RateLimited):
        await gate.admit(
            Applicant(decision, "b", policy)
        )  # the policy's 60,000 would have allowed it
    await gate.settle(RequestOutcome(admitted.decision, "a", 200, 900, 100, 0.1, 1.0, "x"))
    assert events.seen == [1000.0]


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
