"""The dynamic quota controller: load score, forecast, per-tier multipliers, per-key budgets.

What may live here: arithmetic over numbers the caller passes in on each step (P99/SLO, KV
usage, per-key consumption, memory usage). No I/O and no clock: the caller decides the
interval and feeds the values. Every step returns `Adjustment` records naming the inputs
that moved a value, so an SRE can see why a quota moved.

- `HoltWinters`: additive level + trend (+ season once a whole season of history exists).
- `TierMultipliers`: a load score (weights from the policy, the field's 0.7 latency /
  0.3 KV) taken at max(now, forecast) drives per-tier multipliers. Over `shrink_above`,
  sheddable shrinks first, standard once sheddable sits at its floor, critical last. Under
  `grow_below`, critical grows back first, then standard, then sheddable, by small steps.
  Between the two nothing moves, and a move needs its condition on consecutive
  intervals (2 to shrink, 5 to grow): the dead band and the confirmations are what keep
  it from oscillating.
- `KeyBudget`: a key's dynamic budget = P95 of its recent per-interval consumption x a
  safety factor (default 1.3), capped by the key's hard limit; the factor decays x0.9 (floor
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

    what: str  # e.g. "multiplier:sheddable", "safety:key-ab12"
    before: float
    after: float
    inputs: dict[str, float]


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


def load_score(
    p99_over_slo: float | None,
    kv_cache_usage: float | None,
    latency_weight: float = 0.7,
    kv_weight: float = 0.3,
) -> float | None:
    """Weighted load; 1.0 = at the SLO / at a full cache. None without any signal."""
    parts = [(latency_weight, p99_over_slo), (kv_weight, kv_cache_usage)]
    known = [(w, v) for w, v in parts if v is not None]
    if not known:
        return None
    total_weight = sum(w for w, _ in known)
    return sum(w * v for w, v in known) / total_weight


@dataclass
class TierMultipliers:
    shrink_above: float = 1.0
    grow_below: float = 0.8
    shrink_factor: float = 0.8
    grow_step: float = 0.05
    horizon: int = 3  # intervals the forecast looks ahead: act before the ramp arrives
    confirm_shrink: int = 2  # consecutive intervals over the band before shrinking
    confirm_grow: int = 5  # ... under it before growing: slow to trust a recovery
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
        pressure = max(score, forecast if forecast is not None else score)
        inputs = {"score": score, "forecast": forecast if forecast is not None else score}
        self._over = self._over + 1 if pressure > self.shrink_above else 0
        self._under = self._under + 1 if pressure < self.grow_below else 0
        if self._over >= self.confirm_shrink:
            for tier in TIERS_SHRINK_ORDER:  # the first tier not yet at its floor gives way
                if self.values[tier] > FLOORS[tier]:
                    return [self._set(tier, self.values[tier] * self.shrink_factor, inputs)]
            return []
        if self._under >= self.confirm_grow:
            for tier in reversed(TIERS_SHRINK_ORDER):  # critical recovers first
                if self.values[tier] < 1.0:
                    return [self._set(tier, self.values[tier] + self.grow_step, inputs)]
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
    history: deque[float] = field(default_factory=lambda: deque(maxlen=60))

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=self.window)

    def step(self, consumed: float, memory_usage: float | None, key: str) -> list[Adjustment]:
        self.history.append(consumed)
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

    @property
    def budget(self) -> float:
        """P95 of recent consumption x the safety factor, never above the hard limit."""
        if not self.history:
            return self.hard_limit
        p95 = float(np.percentile(np.asarray(self.history, dtype=float), 95))
        return min(self.hard_limit, p95 * self.safety)
