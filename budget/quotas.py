"""The dynamic quota controller: forecast, per-tier multipliers, per-key budgets. It moves the
budgets' limits (admission.budget_step scales them), so it lives beside them.

What may live here: arithmetic over numbers the caller passes in on each step (the load
score, breaker.board.load_score; per-key consumption, memory usage). No I/O and no clock:
the caller decides the interval and feeds the values. Every step returns `Adjustment`
records naming the inputs that moved a value, so an SRE can see why a quota moved.

- `HoltWinters`: additive level + trend (+ season once a whole season of history exists).
- `TierMultipliers`: the load score (breaker.board.load_score: weights from the policy, the
  field's 0.7 latency / 0.3 KV; an engine queue or a KV cache at the breaker's line
  overrides both), taken at max(now, now + trend x horizon), drives per-tier multipliers.
  Over `shrink_above`, sheddable shrinks first, standard once sheddable sits at its floor,
  critical last; the cut is deeper the higher the pressure. Under `grow_below`, critical
  grows back first, then standard, then sheddable, by small steps. Between the two nothing
  moves, and a move needs its condition on consecutive intervals (2 to shrink, or 1 past
  the emergency line; 3 to grow): the dead band and the confirmations keep it from
  oscillating.
- `KeyBudget`: a key's dynamic budget = the larger of the P95 of its recent per-interval
  consumption and its Holt-Winters demand forecast, x a safety factor (default 1.3), capped
  by the key's hard limit; the factor decays x0.9 (floor
  1.1) while GPU/KV memory is above the emergency line (0.7) and recovers when below.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

TIERS_SHRINK_ORDER = ("sheddable", "standard", "critical")  # first to shrink ... last
FLOORS = {"sheddable": 0.1, "standard": 0.3, "critical": 0.6}


@dataclass(frozen=True, slots=True)
class Adjustment:
    """One value the controller moved, and why."""

    what: str  # e.g. "multiplier:sheddable", "safety:key-ab12", "ahead:classes"
    before: float
    after: float
    inputs: dict[str, float]
    reason: str = ""  # in words where the inputs alone do not say it ("raised by forecast")


class HoltWinters:
    """Additive Holt-Winters; seasonal terms start once `season_length` points are seen."""

    def __init__(
        self,
        alpha: float = 0.5,
        beta: float = 0.1,
        gamma: float = 0.3,
        season_length: int | None = None,
    ) -> None:
        if not (0 < alpha <= 1 and 0 <= beta <= 1 and 0 <= gamma <= 1):
            raise ValueError("smoothing factors must be in (0, 1]")
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        self.season_length = season_length
        self.level: float | None = None
        self.trend = 0.0
        self.season: np.ndarray | None = None
        self._first_season: list[float] = []
        self._step = 0

    def update(self, value: float) -> None:
        m = self.season_length
        if m and self.season is None:
            self._first_season.append(value)
            if len(self._first_season) < m:
                self._plain_update(value)
                return
            history = np.asarray(self._first_season, dtype=float)
            self.level = float(history.mean())
            # The first season's slope, from its two halves.
            half = m // 2
            if half:
                self.trend = float(history[half:].mean() - history[:half].mean()) / half
            self.season = history - self.level
            self._step = 0
            return
        if self.season is None or not m:
            self._plain_update(value)
            return
        index = self._step % m
        assert self.level is not None
        previous_level = self.level
        seasonal = float(self.season[index])
        self.level = self.alpha * (value - seasonal) + (1 - self.alpha) * (
            previous_level + self.trend
        )
        self.trend = self.beta * (self.level - previous_level) + (1 - self.beta) * self.trend
        self.season[index] = self.gamma * (value - self.level) + (1 - self.gamma) * seasonal
        self._step += 1

    def _plain_update(self, value: float) -> None:
        if self.level is None:
            self.level = value
            return
        previous = self.level
        self.level = self.alpha * value + (1 - self.alpha) * (previous + self.trend)
        self.trend = self.beta * (self.level - previous) + (1 - self.beta) * self.trend

    def forecast(self, steps_ahead: int = 1) -> float | None:
        if self.level is None:
            return None
        value = self.level + steps_ahead * self.trend
        if self.season is not None and self.season_length:
            value += float(self.season[(self._step + steps_ahead - 1) % self.season_length])
        return value


@dataclass
class TierMultipliers:
    shrink_above: float = 1.0
    grow_below: float = 0.8
    shrink_factor: float = 0.8  # the gentlest cut, just over the line
    deepest_cut: float = 0.5  # the deepest cut in one interval, at pressure >= 2x the line
    emergency: float = 1.5  # pressure at which one interval is enough to cut
    grow_step: float = 0.05  # doubled while the pressure is under half of grow_below
    horizon: int = 3  # intervals the trend looks ahead: act before the ramp arrives
    confirm_shrink: int = 2  # consecutive intervals over the band before cutting
    confirm_grow: int = 3  # ... under it before growing: slower to trust a recovery
    values: dict[str, float] = field(
        default_factory=lambda: {tier: 1.0 for tier in TIERS_SHRINK_ORDER}
    )
    forecaster: HoltWinters = field(default_factory=HoltWinters)
    _over: int = 0
    _under: int = 0

    def step(self, score: float | None) -> list[Adjustment]:
        """One control interval. No signal: hold (neither starve nor flood on no data)."""
        if score is None:
            return []
        self.forecaster.update(score)
        forecast = self.forecaster.forecast(self.horizon)
        # Where the score is heading: today's value plus the smoothed trend. Not the smoothed
        # level, which lags: after a burst it would keep cutting quotas for idle engines.
        heading = score + self.horizon * max(0.0, self.forecaster.trend)
        pressure = max(score, heading)
        inputs = {
            "score": score,
            "forecast": forecast if forecast is not None else score,
            "pressure": pressure,
        }
        self._over = self._over + 1 if pressure > self.shrink_above else 0
        self._under = self._under + 1 if pressure < self.grow_below else 0
        confirmed = self._over >= self.confirm_shrink or (
            self._over >= 1 and pressure >= self.emergency
        )
        if confirmed:
            # Multiplicative decrease in proportion to the overload (x0.8 just over the
            # line, down to x0.5), additive increase below: the AIMD shape that converges
            # without oscillating.
            cut = max(self.deepest_cut, min(self.shrink_factor, self.shrink_above / pressure))
            for tier in TIERS_SHRINK_ORDER:  # the first tier not yet at its floor gives way
                if self.values[tier] > FLOORS[tier]:
                    return [self._set(tier, self.values[tier] * cut, inputs)]
            return []
        if self._under >= self.confirm_grow:
            step = self.grow_step * (2 if pressure < self.grow_below / 2 else 1)
            for tier in reversed(TIERS_SHRINK_ORDER):  # critical recovers first
                if self.values[tier] < 1.0:
                    return [self._set(tier, self.values[tier] + step, inputs)]
        return []

    def _set(self, tier: str, value: float, inputs: dict[str, float]) -> Adjustment:
        before = self.values[tier]
        self.values[tier] = min(1.0, max(FLOORS[tier], value))
        return Adjustment(f"multiplier:{tier}", before, self.values[tier], inputs)


@dataclass
class KeyBudget:
    """A key's dynamic budget per control interval, from its own recent consumption."""

    hard_limit: float
    window: int = 60  # intervals of history
    safety: float = 1.3
    safety_max: float = 1.3
    safety_floor: float = 1.1
    decay: float = 0.9
    emergency_line: float = 0.7
    horizon: int = 3  # intervals the demand forecast looks ahead
    history: deque[float] = field(default_factory=lambda: deque(maxlen=60))
    # The key's demand: Holt-Winters on its consumption per interval. A key whose use is
    # rising gets budget ahead of its own history (a class starting, a launch ramping).
    demand: HoltWinters = field(default_factory=lambda: HoltWinters(alpha=0.3, beta=0.1))

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=self.window)

    def step(self, consumed: float, memory_usage: float | None, key: str) -> list[Adjustment]:
        self.history.append(consumed)
        self.demand.update(consumed)
        adjustments = []
        before = self.safety
        if memory_usage is not None and memory_usage > self.emergency_line:
            self.safety = max(self.safety_floor, self.safety * self.decay)
        elif self.safety < self.safety_max:
            self.safety = min(self.safety_max, self.safety / self.decay)
        if self.safety != before:
            adjustments.append(
                Adjustment(
                    f"safety:{key}",
                    before,
                    self.safety,
                    {"memory_usage": memory_usage if memory_usage is not None else -1.0},
                )
            )
        return adjustments

    def forecast(self) -> float | None:
        """Expected consumption `horizon` intervals ahead (never below zero)."""
        value = self.demand.forecast(self.horizon)
        return None if value is None else max(0.0, value)

    @property
    def budget(self) -> float:
        """max(P95 of recent consumption, the demand forecast) x the safety factor, never
        above the hard limit."""
        if not self.history:
            return self.hard_limit
        p95 = float(np.percentile(np.asarray(self.history, dtype=float), 95))
        return min(self.hard_limit, max(p95, self.forecast() or 0.0) * self.safety)
