"""What a request is charged, and how the budget step answers, with the in-process store."""

from __future__ import annotations

import dataclasses

import pytest

from admission.budget_step import BudgetStep, rate_limit_headers, reserved_charge, settled_charge
from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import ContextLengthExceeded, RateLimited
from admission.events import NoEvents
from breaker.levels import BreakerLevel
from budget.ledger import Charge, Verdict
from budget.store import InProcessStore
from policy.domain import ApiKey, ContextBucket, Limits, Tier
from policy.loader import parse_policy

POLICY = parse_policy({})


def decision(limits: Limits, prompt: int = 1000, max_tokens: int = 500) -> RoutingDecision:
    return RoutingDecision(
        request_id="r",
        caller=ApiKey("cd" * 32, "team", Tier.STANDARD, limits),
        pool="default",
        bucket=ContextBucket("4-8k", 4097, 8192, 1.3),
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        estimate=CountKind.EXACT,
        stream=True,
    )


def outcome(
    d: RoutingDecision,
    status: int,
    prompt: int | None,
    completion: int | None,
    tracking_id: str = "t",
) -> RequestOutcome:
    return RequestOutcome(d, tracking_id, status, prompt, completion, 0.1, 1.0, "via_upstream")


def test_reservation_is_weighted_context() -> None:
    assert reserved_charge(decision(Limits())) == Charge(1500 * 1.3, 1500)


@pytest.mark.parametrize(
    ("status", "prompt", "completion", "expected"),
    [
        (200, 900, 100, Charge(1000 * 1.3, 1000)),  # real usage
        (200, None, 100, Charge(1100 * 1.3, 1100)),  # no prompt count: the estimate stands
        (503, None, None, None),  # upstream error: refund
        (400, None, None, None),
        (0, None, None, None),  # never sent upstream (client left first): refund
        (200, None, None, Charge(1500 * 1.3, 1500)),  # stream cut without usage: keep
    ],
)
def test_settled_charge_rules(
    status: int, prompt: int | None, completion: int | None, expected: Charge | None
) -> None:
    assert settled_charge(outcome(decision(Limits()), status, prompt, completion)) == expected


def test_rate_limit_headers_use_openai_names_and_formats() -> None:
    verdict = Verdict(True, "ok", None, 60, 59, 1000, 400, 36.2)
    assert rate_limit_headers(verdict) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400",
        "x-ratelimit-reset-tokens": "37s",
    }
    minutes = Verdict(True, "ok", None, None, None, 10, 0, 61.0)
    assert rate_limit_headers(minutes) == {
        "x-ratelimit-limit-tokens": "10",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1m1s",
    }
    assert (
        rate_limit_headers(Verdict(True, "ok", None, None, None, 5, 5, 0.25))[
            "x-ratelimit-reset-tokens"
        ]
        == "250ms"
    )


async def test_gate_admits_refuses_and_settles() -> None:
    store = InProcessStore()
    gate = BudgetStep(store, NoEvents(), ttl_s=60)
    limits = Limits(tokens_per_minute=3000)
    first = decision(limits)
    admitted = await gate.admit(Applicant(first, "a", POLICY))
    assert admitted.response_headers["x-ratelimit-remaining-tokens"] == str(3000 - 1950)
    with pytest.raises(RateLimited) as info:
        await gate.admit(Applicant(decision(limits), "b", POLICY))
    refused = info.value
    assert refused.status == 429 and refused.retry_after_s is not None
    assert refused.retry_after_s == 18  # (1950 - 1050) tokens at 3000 per minute
    assert refused.headers["x-ratelimit-remaining-tokens"] == "1050"
    await gate.settle(
        outcome(admitted.decision, 200, 100, 100, tracking_id="a")
    )  # 200 raw, 260 weighted
    assert (await gate.admit(Applicant(decision(limits), "c", POLICY))).decision.pool == "default"
    assert await store.outstanding("cd" * 6) == 1


async def test_gate_refuses_what_can_never_fit_and_key_context_limits() -> None:
    gate = BudgetStep(InProcessStore(), NoEvents(), ttl_s=60)
    with pytest.raises(RateLimited) as info:
        await gate.admit(Applicant(decision(Limits(tokens_per_minute=100)), "a", POLICY))
    assert info.value.retry_after_s is None and "too large" in info.value.message
    with pytest.raises(ContextLengthExceeded) as context:
        await gate.admit(Applicant(decision(Limits(max_context_tokens=1024)), "b", POLICY))
    assert context.value.reason == "key_context_limit"


async def test_the_limits_a_request_was_reserved_under_are_the_ones_it_settles_against() -> None:
    """Reserved at L1 (sheddable budgets halved), settled after the level went back to L0:
    settlement and refunds use the limits in the decision, not a fresh look."""
    store = InProcessStore()
    gate = BudgetStep(store, NoEvents(), ttl_s=60)
    limits = Limits(tokens_per_minute=4000)
    sheddable = ApiKey("ef" * 32, "batch", Tier.SHEDDABLE, limits)
    at_l1 = dataclasses.replace(decision(limits), caller=sheddable, level=BreakerLevel.L1)
    admitted = await gate.admit(Applicant(at_l1, "a", POLICY))
    assert admitted.decision.limits is not None
    assert admitted.decision.limits.tokens_per_minute == 2000  # L1 halves sheddable budgets
    assert admitted.response_headers["x-ratelimit-limit-tokens"] == "2000"
    await gate.release(admitted.decision, "a")  # refunded under the same limits
    assert await store.outstanding(sheddable.key_id) == 0


async def test_a_refused_later_step_refunds_the_whole_reservation() -> None:
    store = InProcessStore()
    gate = BudgetStep(store, NoEvents(), ttl_s=60)
    limits = Limits(tokens_per_minute=3000)
    admitted = await gate.admit(Applicant(decision(limits), "a", POLICY))
    await gate.release(admitted.decision, "a")
    again = await gate.admit(Applicant(decision(limits), "b", POLICY))  # the whole budget is back
    assert again.response_headers["x-ratelimit-remaining-tokens"] == str(3000 - 1950)
