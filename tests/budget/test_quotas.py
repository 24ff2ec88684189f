"""The quota controller on synthetic signals: forecasts, step/ramp/oscillation, key budgets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from breaker.board import load_score
from budget.quotas import FLOORS, HoltWinters, KeyBudget, TierMultipliers


def test_holt_winters_follows_a_linear_trend() -> None:
    model = HoltWinters(alpha=0.5, beta=0.3)
    for t in range(60):
        model.update(10.0 + 2.0 * t)
    forecast = model.forecast(5)
    assert forecast is not None
    assert forecast == pytest.approx(10.0 + 2.0 * 64, rel=0.02)


def test_holt_winters_learns_a_season() -> None:
    period = 12

    def series(t: int) -> float:
        return 100.0 + 0.5 * t + 20.0 * math.sin(2 * math.pi * t / period)

    model = HoltWinters(alpha=0.3, beta=0.05, gamma=0.4, season_length=period)
    for t in range(period * 6):
        model.update(series(t))
    errors = [abs((model.forecast(h) or 0) - series(period * 6 + h - 1)) for h in range(1, 7)]
    assert max(errors) < 4.0, errors  # within 20% of the seasonal amplitude
    flat = HoltWinters(alpha=0.3, beta=0.05)  # the same data without a season
    for t in range(period * 6):
        flat.update(series(t))
    flat_errors = [abs((flat.forecast(h) or 0) - series(period * 6 + h - 1)) for h in range(1, 7)]
    assert sum(errors) < sum(flat_errors)


def test_no_history_no_forecast() -> None:
    assert HoltWinters().forecast() is None
    with pytest.raises(ValueError):
        HoltWinters(alpha=0.0)


def test_load_score_weights_and_missing_signals() -> None:
    assert load_score(1.0, 0.5) == pytest.approx(0.85)
    assert load_score(None, 0.9) == pytest.approx(0.9)
    assert load_score(None, None) is None
    assert load_score(None, None, queue_ratio=0.0) == 0.0  # an idle engine: known, unloaded


def test_saturation_guards_override_the_weighted_average() -> None:
    # Latency still fine, but the engine queues: the queue says "at capacity" at once.
    assert load_score(0.3, 0.6, queue_ratio=0.5) == pytest.approx(1.5)
    assert load_score(0.3, 0.6, queue_ratio=0.0) == pytest.approx(0.39)
    # A KV cache at the breaker's line scores 1.0 whatever the latency says.
    assert load_score(0.2, 0.85, kv_line=0.85) == pytest.approx(1.0)
    assert load_score(0.2, 0.85) == pytest.approx(0.395)


def test_the_cut_deepens_with_the_overload_and_an_emergency_acts_at_once() -> None:
    mild, severe = TierMultipliers(), TierMultipliers()
    assert mild.step(1.1) == []  # one interval just over the line: wait for a second
    (mild_cut,) = mild.step(1.1)
    (severe_cut,) = severe.step(3.0)  # past the emergency line: no confirmation needed
    assert mild_cut.after == pytest.approx(0.8)  # the gentlest cut
    assert severe_cut.after == pytest.approx(0.5)  # the deepest
    assert severe_cut.inputs["pressure"] >= 3.0


def test_step_overload_shrinks_sheddable_first_then_standard_then_critical() -> None:
    control = TierMultipliers()
    order = []
    for _ in range(60):
        for adjustment in control.step(1.5):
            order.append(adjustment.what)
            assert adjustment.after < adjustment.before and "score" in adjustment.inputs
    first = [order.index(f"multiplier:{t}") for t in ("sheddable", "standard", "critical")]
    assert first == sorted(first)
    assert all(control.values[t] >= FLOORS[t] for t in FLOORS)  # bounded
    assert control.values["sheddable"] == pytest.approx(FLOORS["sheddable"])


def test_recovery_is_gradual_and_critical_first() -> None:
    control = TierMultipliers()
    for _ in range(60):
        control.step(1.5)
    recovered = []
    for _ in range(200):
        for adjustment in control.step(0.5):
            assert adjustment.after - adjustment.before <= 2 * control.grow_step + 1e-9
            recovered.append(adjustment.what)
    assert all(v == pytest.approx(1.0) for v in control.values.values())
    tiers = [r.split(":")[1] for r in recovered]
    assert tiers.index("critical") < tiers.index("standard") < tiers.index("sheddable")


def test_ramp_is_met_early_by_the_forecast() -> None:
    with_trend = TierMultipliers()
    moves_at = None
    for t in range(40):
        score = 0.5 + 0.02 * t  # crosses 1.0 at t = 25
        if with_trend.step(score) and moves_at is None:
            moves_at = t
    assert moves_at is not None and moves_at < 25  # the forecast saw it coming


def test_oscillation_around_the_threshold_does_not_flap() -> None:
    control = TierMultipliers()
    rng = np.random.default_rng(4)
    directions = []
    for t in range(300):
        score = 0.9 + 0.08 * math.sin(t / 3) + float(rng.normal(0, 0.01))  # inside the band
        for adjustment in control.step(score):
            directions.append(np.sign(adjustment.after - adjustment.before))
    flips = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    assert flips <= 2, (len(directions), flips)
    assert control.values["critical"] == pytest.approx(1.0)


def test_key_budget_is_p95_times_safety_capped_by_the_hard_limit() -> None:
    budget = KeyBudget(hard_limit=10_000)
    values = [float((i % 10) * 100) for i in range(100)]  # stationary: 0..900, repeating
    for value in values:
        budget.step(value, memory_usage=0.2, key="k")
    forecast = budget.forecast()
    assert forecast is not None and forecast < 900  # no trend: the forecast stays inside
    assert budget.budget == pytest.approx(float(np.percentile(values[-60:], 95)) * 1.3)
    capped = KeyBudget(hard_limit=500)
    capped.step(1000.0, memory_usage=None, key="k")
    assert capped.budget == 500


def test_safety_factor_decays_under_memory_pressure_and_recovers() -> None:
    budget = KeyBudget(hard_limit=1e9)
    logged = []
    for _ in range(20):
        logged += budget.step(100.0, memory_usage=0.9, key="k")
    assert budget.safety == pytest.approx(1.1)  # the floor
    assert logged and logged[0].after == pytest.approx(1.3 * 0.9)
    for _ in range(20):
        budget.step(100.0, memory_usage=0.3, key="k")
    assert budget.safety == pytest.approx(1.3)
