"""The spend step with the in-process store: one budget per tenant across its keys, the
reservation at the request's largest cost, settlement pricing cached and reasoning tokens
apart, a refund when a later step refuses, the warning header, the 429."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from admission.decision import Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import SpendExhausted, SpendUnverified
from admission.spend_step import SpendStep, spend_usage, warning_header
from budget.spend import SpendHold, TokenUsage, windows
from budget.spend_store import InProcessSpendStore
from budget.store import BudgetStoreError
from policy.domain import ApiKey, ContextBucket, Tier
from policy.loader import parse_policy
from policy.schema import UnverifiedSpend

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

    def spend_unverified(self, tenant: str, action: str, cause: str) -> None:
        raise AssertionError("the in-process store always answers")

    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None:
        raise AssertionError("nothing waits: the in-process store always answers")


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


class Flaky(InProcessSpendStore):
    """The in-process store, but `away` (a paused Redis: every call times out) when told."""

    def __init__(self) -> None:
        super().__init__(lambda: NOW_S)
        self.away = False

    def _answer(self) -> None:
        if self.away:
            raise BudgetStoreError("redis spend: TimeoutError") from TimeoutError()

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        self._answer()
        return await super().reserve(*args, **kwargs)

    async def settle(self, *args: Any, **kwargs: Any) -> Any:
        self._answer()
        return await super().settle(*args, **kwargs)

    async def settle_unverified(self, *args: Any, **kwargs: Any) -> Any:
        self._answer()
        return await super().settle_unverified(*args, **kwargs)


class Unverified(Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.unverified: list[tuple[str, str, str]] = []
        self.backlog: list[tuple[int, int, int]] = []

    def spend_unverified(self, tenant: str, action: str, cause: str) -> None:
        self.unverified.append((tenant, action, cause))

    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None:
        self.backlog.append((waiting, settled, lost))


def refusing(policy: Any) -> Any:
    budget = dataclasses.replace(policy.budget, spend_unverified=UnverifiedSpend.REFUSE)
    return dataclasses.replace(policy, budget=budget)


async def test_unanswered_admitted_by_default_and_counted_once_the_store_answers() -> None:
    """`spend_unverified: admit`: the request runs; what it spent is counted once, when the
    store answers again, although its reservation landed late (after it was admitted)."""
    store, events = Flaky(), Unverified()
    spending = SpendStep(store, events, 600, lambda: NOW_S)
    store.away = True
    admitted = await spending.admit(Applicant(decision("ab"), "r1", POLICY))
    hold = admitted.decision.spend
    assert hold is not None and not hold.verified and admitted.response_headers == {}
    assert events.unverified == [("acme", "admitted", "timeout")]
    # It ends while the store is still away: its settlement waits.
    await spending.settle(
        outcome(admitted.decision, "r1", prompt_tokens=1000, completion_tokens=100)
    )
    await spending.reconcile()
    assert len(spending.backlog) == 1 and events.backlog[-1] == (1, 0, 0)
    # The store is back, and the reservation sent while it was slow lands at last.
    store.away = False
    assert (await store.reserve(hold, "r1", 600)).admitted
    await spending.reconcile()
    assert events.backlog[-1] == (0, 1, 0)
    ids = list(hold.window_ids)
    assert await store.used("acme", ids) == {i: 1000 * 1 + 100 * 4 for i in ids}  # once


async def test_unanswered_refused_when_the_policy_says_and_a_late_reservation_refunded() -> None:
    store, events = Flaky(), Unverified()
    spending = SpendStep(store, events, 600, lambda: NOW_S)
    store.away = True
    with pytest.raises(SpendUnverified) as refused:
        await spending.admit(Applicant(decision("ab"), "r1", refusing(POLICY)))
    error = refused.value
    assert (error.status, error.code, error.reason, error.retry_after_s) == (
        503,
        "spend_unverified",
        "spend_unverified",
        1,
    )
    assert events.unverified == [("acme", "refused", "timeout")]
    assert len(spending.backlog) == 1  # its refund, should its reservation land
    store.away = False
    late = acme_hold(5000)
    assert (await store.reserve(late, "r1", 600)).admitted  # it landed after all
    await spending.reconcile()
    assert len(spending.backlog) == 0
    assert set((await store.used("acme", list(late.window_ids))).values()) == {0.0}


def acme_hold(amount: float) -> SpendHold:
    """A hold in acme's windows today, as its request's would be."""
    acme = POLICY.tenants.get("acme")
    assert acme is not None and acme.spend is not None
    spans = windows(acme.spend.windows(), NOW_S)
    return SpendHold("acme", spans, POLICY.tenants.prices.per_token(acme.spend.unit), amount)


async def test_a_settlement_the_store_never_takes_is_given_up_at_its_deadline() -> None:
    now = [NOW_S]
    store, events = Flaky(), Unverified()
    spending = SpendStep(store, events, 600, lambda: now[0])
    admitted = await spending.admit(Applicant(decision("ab"), "r1", POLICY))
    store.away = True
    await spending.release(admitted.decision, "r1")
    await spending.reconcile()
    assert events.backlog[-1] == (1, 0, 0)
    now[0] += 301  # half the reservation's ttl: its reservation may expire before long
    await spending.reconcile()
    assert events.backlog[-1] == (0, 0, 1)
