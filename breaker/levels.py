"""The tiered breaker: a table of rules, a state per pool, and one `step` rule. No I/O.

What may live here: data tables, the pure functions that read them, and `BreakerState`,
advanced only by `step(state, signals, now_s)`. The clock is whatever `now_s` the caller
passes. Everything the breaker did is a `Transition` carrying its reason.

How the level moves:
- Each level has a condition (ENTRY_RULES, evaluated on `Signals`). A level is entered
  when its condition has held continuously for its `enter_hold_s`; a higher level may be
  entered directly.
- Leaving is one level at a time. After `cooldown_s` at a level, if the signals no longer
  call for it, the breaker goes half-open: `probe_fraction` of the traffic the level sheds
  is let through. If the signals stay below the level for `probe_hold_s`, the level drops
  by one; if they call for the level again, the probe failed: back to shedding and a new
  cool-down.
- A drill forces a minimum level until it ends, on top of what the signals say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from policy.schema import BreakerThresholds


class BreakerLevel(IntEnum):
    L0 = 0  # healthy
    L1 = 1  # sheddable long-context refused, sheddable budgets shrink
    L2 = 2  # all sheddable refused, standard context capped
    L3 = 3  # non-critical refused, critical served by the fallback pool


@dataclass(frozen=True, slots=True)
class Signals:
    """One pool's signals at one moment. None means no data; see each field."""

    # Worst P99 TTFT / SLO over the tiers and buckets with enough samples. None: no traffic
    # with an SLO in the window -- nothing says the pool is slow.
    p99_over_slo: float | None = None
    # Share of 5xx among the pool's responses. None: too few responses to tell.
    error_rate: float | None = None
    # Upstream KV-cache usage 0..1 (worst endpoint). Stale or unreachable engine metrics are
    # reported as 1.0 by the scraper: no data from the engine counts as saturated.
    kv_cache_usage: float | None = None
    # GPU memory used 0..1 from NVML. None: no GPU on this node (never an error).
    gpu_memory_usage: float | None = None
    # Requests waiting in the engine's queue per running request (vLLM num_requests_waiting /
    # num_requests_running). Read by the quota controller, not by the level rules: a queue is
    # the first sign of saturation, long before the P99 of finished requests shows it.
    queue_ratio: float | None = None
    # The share of the pool's engines that serve (engines.state). 0.0: every engine is dead
    # or drained, the pool cannot serve anything. None: engines are not tracked.
    engines_up: float | None = None


def _over(value: float | None, limit: float) -> bool:
    return value is not None and value > limit


# The table: (level, reason, condition). Evaluated from the top; a level's condition says
# "at least this bad". Reasons become metric labels: keep them few and fixed.
Rule = tuple[BreakerLevel, str, Callable[[Signals, BreakerThresholds], bool]]
ENTRY_RULES: tuple[Rule, ...] = (
    (BreakerLevel.L3, "no_engines", lambda s, t: s.engines_up == 0.0),
    (BreakerLevel.L3, "error_surge", lambda s, t: _over(s.error_rate, t.l3_error_rate)),
    (BreakerLevel.L3, "gpu_oom", lambda s, t: _over(s.gpu_memory_usage, t.l3_gpu_memory)),
    (BreakerLevel.L3, "p99_far_over_slo", lambda s, t: _over(s.p99_over_slo, t.l3_p99_over_slo)),
    (BreakerLevel.L2, "errors", lambda s, t: _over(s.error_rate, t.l2_error_rate)),
    (BreakerLevel.L2, "gpu_memory", lambda s, t: _over(s.gpu_memory_usage, t.l2_gpu_memory)),
    (BreakerLevel.L2, "p99_well_over_slo", lambda s, t: _over(s.p99_over_slo, t.l2_p99_over_slo)),
    (BreakerLevel.L1, "kv_cache", lambda s, t: _over(s.kv_cache_usage, t.l1_kv_cache)),
    (BreakerLevel.L1, "p99_over_slo", lambda s, t: _over(s.p99_over_slo, t.l1_p99_over_slo)),
)


def called_for(signals: Signals, thresholds: BreakerThresholds) -> dict[BreakerLevel, str]:
    """Every level the signals call for, each with the first reason (L2 implies L1 ...)."""
    levels: dict[BreakerLevel, str] = {}
    for level, reason, condition in ENTRY_RULES:
        if condition(signals, thresholds):
            for lower in range(level, 0, -1):
                levels.setdefault(BreakerLevel(lower), reason)
    return levels


@dataclass(frozen=True, slots=True)
class Transition:
    pool: str
    from_level: BreakerLevel
    to_level: BreakerLevel
    reason: str
    at_s: float


@dataclass(slots=True)
class BreakerState:
    pool: str
    thresholds: BreakerThresholds = field(default_factory=BreakerThresholds)
    level: BreakerLevel = BreakerLevel.L0
    entered_s: float = 0.0
    probing_since_s: float | None = None  # half-open since
    # Since when each level's condition has held without a break.
    holding_since_s: dict[BreakerLevel, float] = field(default_factory=dict)
    drill_level: BreakerLevel = BreakerLevel.L0
    drill_until_s: float = 0.0

    def effective_level(self, now_s: float) -> BreakerLevel:
        drilled = self.drill_level if now_s < self.drill_until_s else BreakerLevel.L0
        return max(self.level, drilled)

    @property
    def probing(self) -> bool:
        return self.probing_since_s is not None

    def drill(self, level: BreakerLevel, now_s: float, duration_s: float) -> None:
        self.drill_level = level
        self.drill_until_s = now_s + duration_s


def step(state: BreakerState, signals: Signals, now_s: float) -> Transition | None:
    """Advance the breaker to `now_s` given the current signals."""
    t = state.thresholds
    calls = called_for(signals, t)
    for level in BreakerLevel:
        if level is BreakerLevel.L0:
            continue
        if level in calls:
            state.holding_since_s.setdefault(level, now_s)
        else:
            state.holding_since_s.pop(level, None)

    # Escalate to the highest level whose condition held long enough.
    for level in sorted(calls, reverse=True):
        held_s = now_s - state.holding_since_s[level]
        if level > state.level and held_s >= t.enter_hold_s[level - 1]:
            return _move(state, level, calls[level], now_s)
        if level <= state.level:
            break

    if state.level is BreakerLevel.L0:
        return None
    if state.level in calls:
        if state.probing:
            # A probe saw the pool still in trouble: shed again and cool down anew.
            state.probing_since_s = None
            state.entered_s = now_s
            return Transition(state.pool, state.level, state.level, "probe_failed", now_s)
        return None
    if not state.probing:
        if now_s - state.entered_s >= t.cooldown_s:
            state.probing_since_s = now_s
        return None
    if now_s - state.probing_since_s >= t.probe_hold_s:  # type: ignore[operator]
        return _move(state, BreakerLevel(state.level - 1), "recovered", now_s)
    return None


def _move(state: BreakerState, level: BreakerLevel, reason: str, now_s: float) -> Transition:
    transition = Transition(state.pool, state.level, level, reason, now_s)
    state.level = level
    state.entered_s = now_s
    state.probing_since_s = None
    return transition
