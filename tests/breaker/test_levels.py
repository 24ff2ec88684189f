"""The breaker state machine on a virtual clock, case by case; and the shedding table."""

from __future__ import annotations

import itertools

import pytest

from breaker.levels import (
    BreakerLevel,
    BreakerState,
    BreakerThresholds,
    Signals,
    Transition,
    called_for,
    step,
)
from breaker.shedding import Action, budget_multiplier, shed
from policy.domain import Tier

L0, L1, L2, L3 = BreakerLevel
FAST = BreakerThresholds(
    enter_hold_s=(10.0, 10.0, 5.0), cooldown_s=30.0, probe_hold_s=20.0, probe_fraction=0.1
)
HEALTHY = Signals(p99_over_slo=0.5, error_rate=0.0, kv_cache_usage=0.3)
SLOW = Signals(p99_over_slo=1.2)  # L1
VERY_SLOW = Signals(p99_over_slo=2.0)  # L2
ERRORS = Signals(error_rate=0.5)  # L3


def run(
    state: BreakerState, timeline: list[tuple[float, Signals]], every_s: float = 1.0
) -> list[Transition]:
    """Feed (until_s, signals) segments one evaluation per second."""
    transitions: list[Transition] = []
    now_s = 0.0
    for until_s, signals in timeline:
        while now_s < until_s:
            moved = step(state, signals, now_s)
            if moved is not None:
                transitions.append(moved)
            now_s += every_s
    return transitions


def new_state() -> BreakerState:
    return BreakerState("default", FAST)


def test_rules_imply_lower_levels() -> None:
    calls = called_for(Signals(error_rate=0.5, kv_cache_usage=0.9), FAST)
    assert calls == {L3: "error_surge", L2: "error_surge", L1: "error_surge"}
    assert called_for(Signals(kv_cache_usage=0.9), FAST) == {L1: "kv_cache"}
    assert called_for(Signals(), FAST) == {}  # no data at all: nothing calls for shedding


def test_escalation_needs_a_sustained_condition() -> None:
    state = new_state()
    # 9 s of slowness then healthy: never long enough for L1.
    assert run(state, [(9, SLOW), (30, HEALTHY)]) == []
    state = new_state()
    moves = run(state, [(15, SLOW)])
    assert [(m.to_level, m.reason, m.at_s) for m in moves] == [(L1, "p99_over_slo", 10.0)]


def test_a_worse_condition_jumps_straight_to_its_level() -> None:
    state = new_state()
    moves = run(state, [(8, ERRORS)])
    assert [(m.from_level, m.to_level, m.reason) for m in moves] == [(L0, L3, "error_surge")]


def test_recovery_is_one_level_at_a_time_with_cooldown_and_probing() -> None:
    state = new_state()
    moves = run(state, [(6, ERRORS), (200, HEALTHY)])
    levels = [(m.from_level, m.to_level, m.at_s) for m in moves]
    # In at 5 s; cool-down 30 s, then 20 s of healthy probing per step down.
    assert levels == [(L0, L3, 5.0), (L3, L2, 55.0), (L2, L1, 105.0), (L1, L0, 155.0)]


def test_a_bad_probe_trips_again() -> None:
    state = new_state()
    moves = run(state, [(15, SLOW), (50, HEALTHY), (52, SLOW), (200, HEALTHY)])
    reasons = [(m.from_level, m.to_level, m.reason, m.at_s) for m in moves]
    assert reasons[0] == (L0, L1, "p99_over_slo", 10.0)
    # Cool-down ends at 40 s, probing from 40 s; the slow signal at 50 s fails the probe.
    assert reasons[1] == (L1, L1, "probe_failed", 50.0)
    assert state.level is L0 and reasons[-1][1] is L0
    assert reasons[-1][3] == 50.0 + 30.0 + 20.0  # a fresh cool-down from the failed probe


def test_no_flapping_under_a_signal_oscillating_around_the_threshold() -> None:
    state = new_state()
    flapping = [(float(t), SLOW if (t // 3) % 2 else HEALTHY) for t in range(1, 300)]
    # Slow 3 s, healthy 3 s, ...: the condition never holds 10 s, so the breaker never trips.
    assert run(state, flapping) == []
    # Once tripped, the same oscillation never lets it recover (probes keep failing) and it
    # never moves more than once per cool-down.
    state = new_state()
    moves = run(state, [(12, SLOW), *[(12 + t, s) for t, s in flapping]])
    assert moves[0].to_level is L1
    assert all(m.to_level is L1 for m in moves)
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(moves)]
    assert all(gap >= FAST.cooldown_s for gap in gaps)


def test_drill_forces_a_minimum_level_until_it_ends() -> None:
    state = new_state()
    state.drill(L3, now_s=100.0, duration_s=60.0)
    assert state.effective_level(120.0) is L3
    assert state.effective_level(160.0) is L0
    assert state.level is L0  # the signals' level is untouched


@pytest.mark.parametrize(
    ("level", "tier", "context", "action", "reason"),
    [
        (L0, Tier.SHEDDABLE, 100_000, Action.ADMIT, "ok"),
        (L1, Tier.SHEDDABLE, 9000, Action.REFUSE, "long_context_shed"),
        (L1, Tier.SHEDDABLE, 4000, Action.ADMIT, "ok"),
        (L1, Tier.STANDARD, 100_000, Action.ADMIT, "ok"),
        (L2, Tier.SHEDDABLE, 100, Action.REFUSE, "tier_shed"),
        (L2, Tier.STANDARD, 9000, Action.REFUSE, "context_capped"),
        (L2, Tier.STANDARD, 8192, Action.ADMIT, "ok"),
        (L2, Tier.CRITICAL, 100_000, Action.ADMIT, "ok"),
        (L3, Tier.STANDARD, 100, Action.REFUSE, "tier_shed"),
        (L3, Tier.CRITICAL, 100, Action.REROUTE, "fallback"),
    ],
)
def test_shedding_table(
    level: BreakerLevel, tier: Tier, context: int, action: Action, reason: str
) -> None:
    verdict = shed(level, tier, context)
    assert (verdict.action, verdict.reason) == (action, reason)


def test_budgets_shrink_sheddable_first_critical_never() -> None:
    for level in BreakerLevel:
        assert budget_multiplier(level, Tier.CRITICAL) == 1.0
        assert budget_multiplier(level, Tier.SHEDDABLE) <= budget_multiplier(level, Tier.STANDARD)
    assert budget_multiplier(L1, Tier.SHEDDABLE) < 1.0
