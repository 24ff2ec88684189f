"""The spend step with the in-process store: one budget per tenant across its keys, the
reservation at the request's largest cost, settlement pricing cached and reasoning tokens
apart, a refund when a later step refuses, the warning header, the 429."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import SpendExhausted
from admission.spend_step import SpendStep, spend_usage, warning_header
from budget.spend import TokenUsage
from budget.spend_store import InProcessSpendStore
from budget.store import BudgetStoreError
from policy.domain import ApiKey, ContextBucket, Tier
from policy.loader import parse_policy

NOW_S = dt.datetime(2026, 12, 31, 12, 0, tzinfo=dt.UTC).timestamp()
POLICY = parse_policy(
    {
        "tenants": {
            "prices": {
                "tokens": {"prompt": 1, "cached_prompt": 0.1, "completion": 4, "reasoning": 8}
            },
            "list": {"acme": {"spend": {"per_day": 10_000, "per_month": 50_000}}, "free": {}},
        },
        "keys": [],
    }
)


class Recorded:
    def __init__(self) -> None:
        self.used: list[tuple[str, str, float, float]] = []

    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None:
        self.used.append((tenant, window, share, before))

    def spend_unchecked(self, tenant: str) -> None:
        raise AssertionError("the in-process store always answers")


def decision(key: str, tenant: str = "acme", prompt: int = 1000, max_tokens: int = 500) -> Any:
    return RoutingDecision(
        request_id=key,
        caller=ApiKey(key * 32, tenant, Tier.STANDARD),
        pool="default",
        bucket=ContextBucket("short", 0, None, 1.0),
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        estimate=CountKind.EXACT,
        stream=True,
    )


def outcome(d: RoutingDecision, rid: str, **usage: Any) -> RequestOutcome:
    fields = {"prompt_tokens": None, "completion_tokens": None, **usage}
    return RequestOutcome(
        d, rid, 200, fields.pop("prompt_tokens"), fields.pop("completion_tokens"), 0.1, 1.0,
        "via_upstream", **fields,
    )  # fmt: skip


@pytest.fixture
def step() -> tuple[SpendStep, InProcessSpendStore, Recorded]:
    store, events = InProcessSpendStore(lambda: NOW_S), Recorded()
    return SpendStep(store, events, 600, lambda: NOW_S), store, events


def test_usage_read_from_the_outcome() -> None:
    d = decision("ab")
    full = outcome(
        d, "t", prompt_tokens=900, completion_tokens=300, cached_prompt_tokens=600,
        reasoning_tokens=200,
    )  # fmt: skip
    assert spend_usage(full) == TokenUsage(900, 300, 600, 200)
    cut = dataclasses.replace(outcome(d, "t"), stream_events=7)
    assert spend_usage(cut) == TokenUsage(1000, 7)  # prompt as counted, a token an event
    assert spend_usage(dataclasses.replace(outcome(d, "t"), status=503)) is None


async def test_keys_of_one_tenant_share_it_and_usage_is_priced_by_kind(step: Any) -> None:
    spending, store, events = step
    first = await spending.admit(Applicant(decision("ab"), "r1", POLICY))
    hold = first.decision.spend
    assert hold is not None and hold.amount == 1000 + 500 * 8  # reasoning is the dearer
    assert first.response_headers == {}
    settled = outcome(
        first.decision, "r1", prompt_tokens=1000, completion_tokens=300,
        cached_prompt_tokens=800, reasoning_tokens=100,
    )  # fmt: skip
    await spending.settle(settled)
    cost = 200 + 800 * 0.1 + 200 * 4 + 100 * 8
    assert await store.used("acme", hold.window_ids) == dict.fromkeys(hold.window_ids, cost)
    # Another key of the same tenant is charged in the same windows; 80% of the day passed.
    other = await spending.admit(Applicant(decision("cd", max_tokens=800), "r2", POLICY))
    assert other.response_headers == {"x-slogate-spend-warning": "day=80%"}
    assert events.used[-2][:2] == ("acme", "day") and events.used[-2][2] >= 0.8
    # A later step refused: the whole reservation comes back.
    await spending.release(other.decision, "r2")
    assert (await store.used("acme", hold.window_ids))[hold.window_ids[0]] == cost
    # A tenant without a budget is not charged at all.
    free = await spending.admit(Applicant(decision("ef", tenant="free"), "r3", POLICY))
    assert free.decision.spend is None


async def test_a_used_up_day_refuses_until_midnight_utc(step: Any) -> None:
    spending, _, _ = step
    big = await spending.admit(Applicant(decision("ab", prompt=9000, max_tokens=10), "r1", POLICY))
    await spending.settle(outcome(big.decision, "r1", prompt_tokens=9000, completion_tokens=400))
    with pytest.raises(SpendExhausted) as refused:
        await spending.admit(Applicant(decision("cd"), "r2", POLICY))
    error = refused.value
    assert (error.status, error.code, error.reason) == (
        429,
        "insufficient_quota",
        "spend_exhausted",
    )
    assert error.retry_after_s == 12 * 3600  # noon: twelve hours to the next day
    assert "'acme'" in error.message and "daily spend budget (10,600 of 10,000 tokens)" in (
        error.message
    )
    assert "resets at 2027-01-01T00:00:00Z" in error.message


def test_warning_header_names_each_window_at_its_highest_share() -> None:
    assert warning_header({"day": 0.79, "month": 0.5}) == {}
    assert warning_header({"day": 1.3, "month": 0.85}) == {
        "x-slogate-spend-warning": "day=100%, month=80%"
    }


class Unreachable(InProcessSpendStore):
    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        raise BudgetStoreError("redis spend_reserve.lua: TimeoutError")


async def test_a_store_that_does_not_answer_admits_unchecked_and_counts_it() -> None:
    unchecked: list[str] = []

    class Counting(Recorded):
        def spend_unchecked(self, tenant: str) -> None:
            unchecked.append(tenant)

    spending = SpendStep(Unreachable(), Counting(), 600, lambda: NOW_S)
    admitted = await spending.admit(Applicant(decision("ab"), "r1", POLICY))
    assert admitted.decision.spend is None and unchecked == ["acme"]
    await spending.settle(outcome(admitted.decision, "r1", prompt_tokens=1, completion_tokens=1))
