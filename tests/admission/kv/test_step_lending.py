"""The KV step lends the reserve above a tier while nobody above waits (budget.lending):
sheddable fills past its share in a calm, is held to it the moment a tier above waits, and
a tier above kept waiting calls the loan back."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from admission.decision import Applicant
from admission.errors import Overloaded
from admission.events import NoEvents
from admission.kv.step import KvStep
from policy.domain import Tier
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.clock import VirtualClock
from tests.support.decisions import caller, decision, outcome

CALM = 0.3


def slots_policy(lend_up_to: float = 0.96) -> Policy:
    """100 batch slots in the default pool: a tier's share is that many requests."""
    return parse_policy(
        {
            "pools": {
                "default": {"endpoints": ["127.0.0.1:1"], "max_num_seqs": 100},
                "long": {"endpoints": ["127.0.0.1:2"]},
                "fallback": {"endpoints": ["127.0.0.1:3"]},
            },
            "breaker": {
                "kv_shares": {"critical": 1.0, "standard": 0.95, "sheddable": 0.85},
                "kv_lend_up_to": lend_up_to,
            },
            "waiting_room": {"max_wait_s": {"critical": 2.0, "standard": 2.0, "sheddable": 2.0}},
        }
    )


class Pool:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.clock = VirtualClock()
        self.kv = KvStep(
            NoEvents(),
            self.clock,
            ttl_s=660,
            policy=lambda: self.policy,
            new_waiter=lambda: asyncio.get_running_loop().create_future(),
            wait_cap_s=policy.longest_wait_s,
        )
        self.admitted: list[str] = []
        self.decisions: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def send(self, rid: str, tier: Tier) -> None:
        d = dataclasses.replace(
            decision(1000, tier=tier, policy=self.policy), caller=caller(tier, key=rid[0])
        )
        self.decisions[rid] = d

        async def admit() -> None:
            await self.kv.admit(Applicant(d, rid, self.policy))
            self.admitted.append(rid)

        self.tasks[rid] = asyncio.create_task(admit())
        await asyncio.sleep(0)

    async def end(self, rid: str) -> None:
        await self.kv.settle(outcome(self.decisions[rid], rid))
        await asyncio.sleep(0)

    async def calm(self, intervals: int) -> None:
        for _ in range(intervals):
            self.kv.shares.step(self.policy, CALM)
        await self.kv.dispatcher.dispatch()  # the room's tick offers what the loan freed
        await asyncio.sleep(0)


async def test_sheddable_fills_the_reserve_in_a_calm_and_yields_it_to_a_waiting_tier() -> None:
    pool = Pool(slots_policy())
    for i in range(90):
        await pool.send(f"s{i}", Tier.SHEDDABLE)
    assert len(pool.admitted) == 85  # its policy share: 85 of 100 slots
    await pool.calm(10)
    assert len(pool.admitted) == 90  # lent: up to 96, five waited for it
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.96
    assert pool.kv.shares.share(pool.policy, "default", Tier.STANDARD) == 0.96  # critical's reserve
    for i in range(7):
        await pool.send(f"t{i}", Tier.STANDARD)
    assert pool.admitted[-6:] == [f"t{i}" for i in range(6)]  # 96 of standard's 96
    # A standard request waits: from now on sheddable is held to its policy share.
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.85
    await pool.send("s-late", Tier.SHEDDABLE)
    await pool.end("s0")
    assert pool.admitted[-1] == "t6" and "s-late" not in pool.admitted
    # Nobody above waits now: the loan applies again, and the next end lets s-late in.
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.96
    await pool.end("s1")
    assert pool.admitted[-1] == "s-late"


async def test_a_tier_above_kept_waiting_calls_the_loan_back() -> None:
    pool = Pool(slots_policy())
    await pool.calm(10)
    lent = pool.kv.shares.lending[Tier.SHEDDABLE].lent["default"]
    assert lent > 0.1
    for i in range(96):
        await pool.send(f"s{i}", Tier.SHEDDABLE)
    await pool.send("t", Tier.STANDARD)
    assert "t" not in pool.admitted
    pool.clock.now_s += 1.9  # 95% of its 2 s wait
    moved = pool.kv.shares.step(pool.policy, CALM)
    assert [m.what for m in moved] == ["kv_lend:sheddable:default"]  # standard waited, not critical
    assert pool.kv.shares.lending[Tier.SHEDDABLE].lent["default"] < lent
    # A policy that lends nothing: the shares are the policy's, whatever the calm.
    quiet = Pool(slots_policy(lend_up_to=0.0))
    await quiet.calm(30)
    assert quiet.kv.shares.share(quiet.policy, "default", Tier.SHEDDABLE) == 0.85
    assert quiet.kv.shares.share(quiet.policy, "default", Tier.STANDARD) == 0.95


async def test_the_loan_is_lent_in_small_pieces_and_not_where_engines_hold_more() -> None:
    """A request holding an eighth or more of its tier's share is admitted against that
    share, not the loan; engines reporting more than the ceiling call the loan back."""
    pool = Pool(slots_policy())
    await pool.calm(10)
    for i in range(80):
        await pool.send(f"s{i}", Tier.SHEDDABLE)
    large = dataclasses.replace(
        decision(1000, tier=Tier.SHEDDABLE, policy=pool.policy, sequences=11),
        caller=caller(Tier.SHEDDABLE, key="L"),
    )
    task = asyncio.create_task(pool.kv.admit(Applicant(large, "large", pool.policy)))
    await asyncio.sleep(0)
    assert not task.done()  # 91 of 96 lent, but 91 of its own 85: it waits
    pool.kv.dispatcher.room.leave("large")
    task.cancel()
    await pool.send("small", Tier.SHEDDABLE)
    assert pool.admitted[-1] == "small"  # 81 of 96: the loan holds for a small one
    lent = pool.kv.shares.lending[Tier.SHEDDABLE].lent["default"]
    pool.kv.shares.step(pool.policy, CALM, lambda name: 0.99)  # the ceiling is 0.96
    assert pool.kv.shares.lending[Tier.SHEDDABLE].lent["default"] < lent


async def test_without_a_waiting_room_a_refusal_above_calls_the_loan_back() -> None:
    """Refused at once for room (no waiting room): nothing ever waits, so the refusal itself
    counts as a whole wait (without it, a simulated refuse-at-once fleet lent on while
    standard was refused: burst handling 0.76 -> 0.50)."""
    policy = slots_policy()
    kv = KvStep(NoEvents(), VirtualClock(), ttl_s=660, policy=lambda: policy)
    for _ in range(10):
        kv.shares.step(policy, CALM)
    lent = kv.shares.lending[Tier.SHEDDABLE].lent["default"]
    for i in range(96):
        d = dataclasses.replace(
            decision(1000, tier=Tier.SHEDDABLE, policy=policy), caller=caller(Tier.SHEDDABLE)
        )
        await kv.admit(Applicant(d, f"s{i}", policy))
    standard = decision(1000, tier=Tier.STANDARD, policy=policy)
    with pytest.raises(Overloaded):
        await kv.admit(Applicant(standard, "t", policy))
    kv.shares.step(policy, CALM)
    assert kv.shares.lending[Tier.SHEDDABLE].lent["default"] < lent


async def test_a_reservation_ahead_of_a_ramp_caps_the_loan_and_calls_it_back() -> None:
    """The quota controller's cap (budget.ahead: headroom kept for a ramping tenant) wins over
    the loan, and the loan does not grow unseen behind it, to land whole when it lifts."""
    pool = Pool(slots_policy())
    await pool.calm(10)
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.96
    pool.kv.shares.caps["sheddable"] = 0.7
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.7
    await pool.calm(10)
    assert pool.kv.shares.lending[Tier.SHEDDABLE].lent["default"] == 0.0
    pool.kv.shares.caps.clear()  # given back: sheddable at its policy share, the loan regrows
    assert pool.kv.shares.share(pool.policy, "default", Tier.SHEDDABLE) == 0.85
    assert pool.kv.shares.share(pool.policy, "default", Tier.STANDARD) == 0.96  # never capped
