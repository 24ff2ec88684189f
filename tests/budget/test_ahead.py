"""Quotas ahead of time: a raise within the lead, sheddable squeezed first, given back after
the ramp, expired when the ramp does not come, idle hours lent; every move with a reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from budget.ahead import AheadCeilings, AheadPlanner, AheadSeat, reason_label, tenant_tiers
from forecast.outlook import Expected
from policy._ahead import AheadConfig
from policy.domain import ApiKey, Limits, Tier
from policy.loader import parse_policy

TIERS = {"support": "critical", "classes": "standard", "reports": "sheddable"}
REACTIVE = {"critical": 1.0, "standard": 0.6, "sheddable": 0.8}


@dataclass
class Ramp:
    """An outlook: `tenant` at `multiple` from `start_s` to `end_s`, flat otherwise."""

    tenant: str = "classes"
    start_s: float = 1000.0
    end_s: float = 2000.0
    multiple: float = 8.0
    reason: str = "calendar:class"
    known: set[str] = field(default_factory=set)  # tenants it knows to be flat

    def expected(self, tenant: str, now_s: float, at_s: float) -> Expected | None:
        if tenant == self.tenant and self.start_s <= at_s < self.end_s:
            return Expected(tenant, at_s, self.multiple, None, self.reason)
        if tenant in self.known or tenant == self.tenant:
            return Expected(tenant, at_s, 1.0, None, self.reason) if self.known else None
        return None


def planner(outlook: Ramp, **config: float) -> AheadPlanner:
    # A 10-minute lead and a 15-minute grace, stepped every 60 s below.
    return AheadPlanner.from_config(AheadConfig(**config), outlook)  # type: ignore[arg-type]


def run(
    plan: AheadPlanner,
    until_s: float,
    demand: dict[str, Any],
    score: float = 0.3,
    from_s: float = 0.0,
) -> list[tuple[float, str]]:
    """Controller intervals of 60 s from `from_s` to `until_s`: the moves, when."""
    moves = []
    t = from_s
    while t <= until_s:
        measured = {k: (v(t) if callable(v) else v) for k, v in demand.items()}
        moves += [(t, m.reason) for m in plan.step(t, TIERS, measured, score)]
        t += 60.0
    return moves


def test_raised_within_the_lead_squeezing_sheddable_first_then_given_back() -> None:
    plan = planner(Ramp())
    ramp = {"classes": lambda t: 800.0 if t >= 1000 else 100.0, "support": 50.0}
    assert run(plan, 360, ramp) == []  # the ramp (at 1000 s) is more than a lead away
    assert run(plan, 420, ramp, from_s=420) == [(420.0, "raised by calendar event class")]
    applied = plan.multipliers(REACTIVE)
    assert applied["standard"] == 1.0  # held at its contract, whatever the reaction says
    assert applied["sheddable"] == 0.5  # squeezed to make room ...
    assert applied["critical"] == 1.0  # ... and critical untouched
    assert plan.kv_share_caps() == {"sheddable": 0.7}
    assert plan.status()["raised"] == {
        "classes": {
            "reason": "raised by calendar event class",
            "multiple": 8.0,
            "since_s": 420.0,
            "ramp_came": False,
        }
    }
    # The ramp comes at 1000 s (confirmed over three intervals): given back a lead later,
    # and not raised again while the event runs.
    moves = run(plan, 3000, ramp, from_s=480)
    assert moves == [(1720.0 + 20.0, "given back")]
    assert plan.multipliers(REACTIVE) == REACTIVE and plan.kv_share_caps() == {}
    # A ramp that comes only as its event ends is given back a lead after the event.
    plan = planner(Ramp(), grace_min=30.0)
    assert run(plan, 3000, {"classes": lambda t: 800.0 if t >= 1980 else 100.0})[-1] == (
        2580.0,
        "given back",
    )


def test_a_ramp_that_does_not_come_expires_after_lead_plus_grace() -> None:
    plan = planner(Ramp(end_s=9000.0))
    moves = run(plan, 6000, {"classes": 100.0})
    # Raised at 1000 - 600 = 400 (the 60 s steps: 420), expired 600 + 900 s later, and not
    # raised again while the same expectation holds.
    assert moves == [
        (420.0, "raised by calendar event class"),
        (1920.0, "given back: the ramp did not come"),
    ]
    assert plan.multipliers(REACTIVE) == REACTIVE  # the reactive controller alone again
    assert plan.status()["expired"] == {"classes": "calendar:class"}


def test_a_late_ramp_after_expiry_is_left_to_the_reaction() -> None:
    plan = planner(Ramp(start_s=1000.0, end_s=2000.0))
    late = {"classes": lambda t: 800.0 if t >= 4600 else 100.0}  # an hour late
    moves = run(plan, 6000, late)
    assert [reason_label(r) for _, r in moves] == ["calendar", "expired"]
    assert moves[-1][0] <= 1000.0 - 600.0 + 600.0 + 900.0 + 60.0  # bounded: lead + grace


def test_a_sheddable_tenant_ramping_squeezes_nobody() -> None:
    plan = planner(Ramp(tenant="reports", reason="forecast"))
    moves = run(plan, 500, {"reports": 10.0})
    assert moves == [(420.0, "raised by forecast")]
    applied = plan.multipliers(REACTIVE)
    assert applied["sheddable"] == 1.0 and applied["standard"] == 0.6
    assert plan.kv_share_caps() == {}


def test_idle_hours_are_lent_to_batch_and_taken_back_a_lead_before_the_ramp() -> None:
    outlook = Ramp(start_s=3000.0, end_s=4000.0, known={"support"}, reason="forecast")
    plan = planner(outlook, lend=3.0)
    quiet = {"classes": 100.0, "support": 10.0}
    assert run(plan, 2340, quiet) == [(0.0, "lent to batch: forecast idle")]
    assert plan.multipliers(REACTIVE) == {**REACTIVE, "sheddable": 0.8 * 3.0}
    # A lead before the ramp: the lending is given back and the raise squeezes.
    moves = run(plan, 2500, quiet, from_s=2400)
    assert moves == [(2400.0, "raised by forecast"), (2400.0, "given back")]
    assert plan.multipliers(REACTIVE)["sheddable"] == 0.5
    # A busy fleet lends nothing; neither does an outlook that knows nothing.
    busy = planner(Ramp(start_s=3000.0, known={"support"}), lend=3.0)
    assert run(busy, 600, {"classes": 100.0}, score=0.9) == []
    blind = planner(Ramp(start_s=3000.0), lend=3.0)
    assert run(blind, 600, {"classes": 100.0}) == []


def test_every_move_has_a_reason_and_a_bounded_label() -> None:
    plan = planner(Ramp(end_s=9000.0, known={"support"}), lend=2.0)
    moves = []
    for t in range(0, 6000, 60):
        moves += plan.step(float(t), TIERS, {"classes": 100.0, "support": 10.0}, 0.3)
    assert moves and all(m.reason for m in moves)
    assert {reason_label(m.reason) for m in moves} <= {
        "forecast",
        "calendar",
        "given_back",
        "expired",
        "lent",
    }


def test_a_raised_tenant_s_key_ceilings_give_way_to_its_contract() -> None:
    class Ceilings:
        def tokens_per_minute(self, key: ApiKey) -> float | None:
            return 1000.0

    plan = planner(Ramp())
    key = ApiKey("sk-c", "classes", Tier.STANDARD, Limits(tokens_per_minute=50_000))
    ceilings = AheadCeilings(Ceilings(), lambda: plan)
    assert ceilings.tokens_per_minute(key) == 1000.0
    run(plan, 420, {"classes": 100.0})
    assert ceilings.tokens_per_minute(key) is None  # the policy's limit applies


def test_the_seat_rebuilds_on_a_new_section_and_keeps_raises_across_a_refit() -> None:
    seat = AheadSeat()
    config = AheadConfig()
    assert seat.current(None) is None
    first = seat.current(config)
    assert first is not None and seat.current(config) is first
    seat.forecast = Ramp(reason="forecast")
    assert seat.current(config) is first and first.outlook is seat.forecast  # a refit
    assert seat.current(AheadConfig(lead_min=5)) is not first  # a reload


def test_a_tenant_is_stepped_at_its_first_keys_tier() -> None:
    """The sidecar and the simulator read a tenant's tier the same way (budget.ahead)."""
    policy = parse_policy(
        {
            "keys": [
                {"key": "sk-a1", "tenant": "a", "tier": "standard"},
                {"key": "sk-a2", "tenant": "a", "tier": "critical"},
                {"key": "sk-b", "tenant": "b", "tier": "sheddable"},
            ]
        }
    )
    assert tenant_tiers(policy.keys.values()) == {"a": "standard", "b": "sheddable"}
