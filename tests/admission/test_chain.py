"""The admission chain and its steps, without gRPC: what each step decides, and that
nothing is held after any way a request can end early."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from admission.assembly import build_admission
from admission.breaker_step import BreakerStep
from admission.chain import AdmissionChain
from admission.decision import Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import ContextLengthExceeded, Overloaded, RateLimited, RequestRejected, Shed
from admission.events import NoEvents
from admission.kv.capacity import kv_footprint
from admission.kv.step import KvStep
from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel
from budget.store import InProcessStore
from policy.domain import Limits, Tier
from policy.loader import parse_policy
from tests.support.clock import VirtualClock
from tests.support.decisions import caller, decision, outcome

CAPACITY = 10_000
POLICY = parse_policy(
    {
        "pools": {
            "default": {"endpoints": ["127.0.0.1:1"], "kv_capacity_tokens": CAPACITY},
            "long": {"endpoints": ["127.0.0.1:2"]},
            "fallback": {"endpoints": ["127.0.0.1:3"]},
        },
        "model": {"fallback_model": "small-model"},
    }
)


class _Waiting:
    """A step that waits for ever (Redis that never answers), until cancelled."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def admit(self, applicant: Applicant) -> Admitted:
        self.entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        pass

    async def settle(self, outcome: RequestOutcome) -> None:
        pass


class _Broken(_Waiting):
    async def admit(self, applicant: Applicant) -> Admitted:
        raise KeyError("a bug in a later step")


class _Refusing(_Waiting):
    async def admit(self, applicant: Applicant) -> Admitted:
        raise RateLimited("no", reason="budget_tokens")


def kv_step() -> KvStep:
    return KvStep(NoEvents(), VirtualClock(), ttl_s=660, policy=lambda: POLICY)


def held(step: KvStep) -> int:
    return step.book.view("default").tokens


@pytest.mark.parametrize("later", [_Refusing, _Broken])
async def test_whatever_ends_admission_gives_back_what_earlier_steps_hold(later: type) -> None:
    kv = kv_step()
    chain = AdmissionChain([kv, later()])
    with pytest.raises((RateLimited, KeyError)):
        await chain.admit(
            Applicant(decision(2000, tier=Tier.CRITICAL, policy=POLICY), "r1", POLICY)
        )
    assert held(kv) == 0 and kv.book.holds == 0


async def test_a_request_cancelled_while_a_step_waits_holds_nothing() -> None:
    """Envoy timing out, or the client resetting, while the budget step waits on Redis."""
    kv = kv_step()
    waiting = _Waiting()
    chain = AdmissionChain([kv, waiting])
    task = asyncio.create_task(
        chain.admit(Applicant(decision(2000, tier=Tier.CRITICAL, policy=POLICY), "r1", POLICY))
    )
    await waiting.entered.wait()
    assert held(kv) == 2000  # the KV step admitted before the wait began
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held(kv) == 0 and kv.book.holds == 0


async def test_a_hold_whose_end_never_comes_expires() -> None:
    clock = VirtualClock()
    kv = KvStep(NoEvents(), clock, ttl_s=60, policy=lambda: POLICY)
    await kv.admit(Applicant(decision(2000, tier=Tier.CRITICAL, policy=POLICY), "r1", POLICY))
    clock.advance(59)
    assert await kv.expire() == [] and held(kv) == 2000
    clock.advance(2)
    assert await kv.expire() == ["r1"] and held(kv) == 0


async def test_the_chain_settles_every_step_even_when_one_fails() -> None:
    kv = kv_step()

    class _SettleFails(_Waiting):
        async def admit(self, applicant: Applicant) -> Admitted:
            return Admitted(applicant.decision)

        async def settle(self, outcome: RequestOutcome) -> None:
            raise RuntimeError("broken sink")

    chain = AdmissionChain([_SettleFails(), kv])
    admitted = await chain.admit(
        Applicant(decision(2000, tier=Tier.CRITICAL, policy=POLICY), "r1", POLICY)
    )
    await chain.record(outcome(admitted.decision, tracking_id="r1"))
    assert held(kv) == 0


@pytest.mark.parametrize("settle_apart", [False, True], ids=["in-process", "shared"])
async def test_a_settlement_through_shared_stores_runs_in_a_task_of_its_own(
    settle_apart: bool,
) -> None:
    """Shared stores bound their round trips with asyncio.timeout, which cancels the task
    it runs in on expiry: their settlement never runs on the caller's task (the access-log
    stream's); in this process it does, costing no task."""
    ran_in: list[asyncio.Task[object] | None] = []

    class _Settling(_Waiting):
        async def settle(self, outcome: RequestOutcome) -> None:
            ran_in.append(asyncio.current_task())

    chain = AdmissionChain([_Settling()], settle_apart=settle_apart)
    await chain.record(outcome(decision(2000, policy=POLICY), tracking_id="r1"))
    assert len(ran_in) == 1 and (ran_in[0] is asyncio.current_task()) is not settle_apart


async def test_the_kv_step_refuses_past_the_tiers_share_and_skips_cheap_requests() -> None:
    kv = kv_step()
    standard = decision(4000, policy=POLICY)  # standard: 95% of 10,000
    await kv.admit(Applicant(standard, "a", POLICY))
    await kv.admit(Applicant(standard, "b", POLICY))
    with pytest.raises(Overloaded) as info:
        await kv.admit(Applicant(decision(2000, policy=POLICY), "c", POLICY))  # 10,000 > 9,500
    assert info.value.reason == "kv_cache_full" and info.value.retry_after_s == 1
    await kv.admit(
        Applicant(decision(1500, tier=Tier.CRITICAL, policy=POLICY), "d", POLICY)
    )  # 9,500
    from policy.apis import api_named

    models = api_named("models")
    assert models is not None
    cheap = dataclasses.replace(decision(0, 0, policy=POLICY), api=models)
    assert (await kv.admit(Applicant(cheap, "e", POLICY))).decision is cheap and kv.book.holds == 3


def board_at(level: BreakerLevel, clock: VirtualClock) -> BreakerBoard:
    board = BreakerBoard(
        lambda: POLICY, ResponseWindows(clock), lambda pool: None, lambda: None, clock
    )
    board.drill("default", level, duration_s=600)
    return board


@pytest.mark.parametrize(
    ("level", "tier", "context", "expected"),
    [
        (BreakerLevel.L0, Tier.SHEDDABLE, 20_000, "admit"),
        (BreakerLevel.L1, Tier.SHEDDABLE, 20_000, "shed_long_context_shed"),
        (BreakerLevel.L1, Tier.SHEDDABLE, 2_000, "admit"),
        (BreakerLevel.L2, Tier.SHEDDABLE, 2_000, "shed_tier_shed"),
        (BreakerLevel.L2, Tier.STANDARD, 20_000, "shed_context_capped"),
        (BreakerLevel.L2, Tier.CRITICAL, 20_000, "admit"),
        (BreakerLevel.L3, Tier.STANDARD, 2_000, "shed_tier_shed"),
        (BreakerLevel.L3, Tier.CRITICAL, 2_000, "fallback"),
    ],
)
async def test_the_breaker_step_applies_the_shedding_table(
    level: BreakerLevel, tier: Tier, context: int, expected: str
) -> None:
    step = BreakerStep(board_at(level, VirtualClock()), NoEvents(), random.Random(1))
    request = decision(context, tier=tier, policy=POLICY)
    if expected.startswith("shed_"):
        with pytest.raises(RequestRejected) as info:
            await step.admit(Applicant(request, "r", POLICY))
        assert info.value.reason == expected and (info.value.retry_after_s or 0) >= 1
        # The endpoint picker protocol's 429 for the sheddable tier; 503 for the others.
        assert info.value.status == (429 if tier is Tier.SHEDDABLE else 503)
        assert isinstance(info.value, Shed if tier is Tier.SHEDDABLE else Overloaded)
        return
    admitted = await step.admit(Applicant(request, "r", POLICY))
    assert admitted.decision.level is level  # carried to the budget step and settlement
    if expected == "fallback":
        assert admitted.decision.pool == "fallback"
        assert admitted.decision.model_override == "small-model"
        assert admitted.response_headers["x-slogate-degraded"] == "L3"
    else:
        assert admitted.decision.pool == request.pool


async def test_the_assembled_chain_runs_access_breaker_budget_kv_in_that_order() -> None:
    """A budget is a contract: refused at once, before a request could wait for KV room."""
    clock = VirtualClock()
    store = InProcessStore(clock)
    admission = build_admission(
        board=board_at(BreakerLevel.L1, clock),
        store=store,
        events=NoEvents(),
        clock=clock,
        ttl_s=660,
        policy=lambda: POLICY,
    )
    assert [type(s).__name__ for s in admission.chain.steps] == [
        "AccessStep",
        "BreakerStep",
        "BudgetStep",
        "KvStep",
    ]
    sheddable = dataclasses.replace(
        decision(2000, tier=Tier.SHEDDABLE, policy=POLICY),
        caller=caller(Tier.SHEDDABLE, limits=Limits(tokens_per_minute=1000)),
    )
    with pytest.raises(RateLimited):  # L1 halves sheddable budgets: 2000 > 500
        await admission.chain.admit(Applicant(sheddable, "r1", POLICY))
    assert admission.kv.book.holds == 0  # the budget refusal gave the KV room back


async def test_a_request_no_engine_can_hold_is_refused_with_400_holding_nothing() -> None:
    """The operator's case: a pool of two 8,000-token engines holds 16,000 tokens, but a
    request of a ~6k-token context needing ~11k (its bucket's KV weight 1.8) runs on neither
    (vLLM answered 400): refused before anything is held, budget and KV alike."""
    clock = VirtualClock()
    store = InProcessStore(clock)
    policy = parse_policy(
        {
            "pools": {
                "default": {
                    "endpoints": ["127.0.0.1:1", "127.0.0.1:2"],
                    "kv_capacity_tokens": 16_000,
                },
                "long": {"endpoints": ["127.0.0.1:3"], "kv_capacity_tokens": 16_000},
                "fallback": {"endpoints": ["127.0.0.1:4"]},
            },
        }
    )
    admission = build_admission(
        store=store,
        board=None,
        events=NoEvents(),
        clock=clock,
        ttl_s=660,
        policy=lambda: policy,
        largest_engine=lambda spec: (spec.kv_capacity_tokens or 0) / 2,
    )
    big = dataclasses.replace(decision(6_000, max_tokens=1_000, policy=policy), request_id="r1")
    footprint = kv_footprint(6_000, big.bucket)
    assert 8_000 < footprint < 16_000 * 0.95  # the pool would have admitted it
    with pytest.raises(ContextLengthExceeded) as info:
        await admission.chain.admit(Applicant(big, "r1", policy))
    refused = info.value
    assert (refused.status, refused.code, refused.reason) == (
        400,
        "context_length_exceeded",
        "engine_kv_exceeded",
    )
    assert f"needs {footprint} tokens of KV cache" in refused.message
    assert "the largest: 8000 tokens" in refused.message
    assert admission.kv.book.holds == 0 and admission.kv.book.view(big.pool).tokens == 0
    assert await store.outstanding(big.caller.key_id) == 0  # the budget's reservation given back
    # One that fits the largest engine is admitted as before.
    fits = decision(2_000, max_tokens=1_000, policy=policy)
    admitted = await admission.chain.admit(Applicant(fits, "r2", policy))
    assert admission.kv.book.holds == 1 and admitted.decision.pool == fits.pool
