"""The sidecar's periodic work: evaluate the breakers, step the quota controller.

What lives here: `BreakerLoop` (evaluates the board on an interval, exports levels,
transitions and signals to Prometheus, applies drills) and `QuotaLoop` (each controller
interval: the fleet's load score -> tier multipliers, the quotas moved ahead of forecast
or declared ramps (budget.ahead: what admission applies), the KV footprint ratio learned
from the engines, the per-key dynamic quotas; every move logged and exported). The
decisions themselves are pure (breaker.board, budget.quotas, budget.ahead,
budget.key_quotas); this module runs them on the clock and tells Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from admission.kv.step import KvStep
from breaker.board import BreakerBoard
from breaker.levels import BreakerLevel, Transition
from budget.ahead import AheadSeat, reason_label, tenant_tiers
from budget.key_quotas import KeyQuotas
from budget.quotas import Adjustment, TierMultipliers
from extproc.service.metrics import SidecarMetrics
from policy.domain import ApiKey
from policy.schema import Policy

log = logging.getLogger("slogate.loops")

# Keys stepped between two turns of the loop: ~2-3 ms of work at ~10 us a key.
KEYS_PER_SLICE = 256


class BreakerLoop:
    """Evaluates the board and keeps Prometheus (and the admin view) in step with it."""

    def __init__(
        self,
        board: BreakerBoard,
        metrics: SidecarMetrics,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        self._board = board
        self._metrics = metrics
        self.on_transition = on_transition  # the admin view's "last transition"

    def tick(self) -> None:
        for transition in self._board.evaluate():
            log.warning(
                "breaker %s: L%d -> L%d (%s)",
                transition.pool,
                transition.from_level,
                transition.to_level,
                transition.reason,
            )
            self._metrics.breaker_transitions(
                transition.pool,
                f"L{int(transition.from_level)}",
                f"L{int(transition.to_level)}",
                transition.reason,
            ).inc()
            if self.on_transition is not None:
                self.on_transition(transition)
        self.export()

    def export(self) -> None:
        now_s = time.monotonic()
        for name in self._board.names():
            self._metrics.breaker_level(name).set(int(self._board.level(name)))
            state = self._board.states.get(name)
            drilled = BreakerLevel.L0
            if state is not None and now_s < state.drill_until_s:
                drilled = state.drill_level
            self._metrics.breaker_drill(name).set(int(drilled))
            reading = self._board.readings.get(name)
            if reading is None:
                continue
            for signal, value in (
                ("p99_over_slo", reading.signals.p99_over_slo),
                ("error_rate", reading.signals.error_rate),
                ("kv_cache_usage", reading.signals.kv_cache_usage),
                ("gpu_memory_usage", reading.signals.gpu_memory_usage),
                ("queue_ratio", reading.signals.queue_ratio),
            ):
                # NaN says "no data" in Prometheus without inventing a value.
                self._metrics.breaker_signal(name, signal).set(math.nan if value is None else value)


class QuotaLoop:
    """One controller interval: what the fleet's load says about every tier and key."""

    def __init__(
        self,
        *,
        policy: Callable[[], Policy],
        board: BreakerBoard,
        quotas: TierMultipliers,
        key_quotas: KeyQuotas,
        kv: KvStep,
        kv_cache_usage: Callable[[str], float | None] | None,
        metrics: SidecarMetrics,
        applied: dict[str, float] | None = None,
        ahead: AheadSeat | None = None,
        wall_clock: Callable[[], float] = time.time,
        on_ahead_move: Callable[[str, str, float, float], None] | None = None,
    ) -> None:
        """`kv_cache_usage(pool)`: the engines' KV usage the footprint ratio is learned
        from (None: engine metrics are not scraped). `applied`: the tier multipliers
        admission reads (the reactive ones through the planner; None: the reactive ones
        are read directly); `ahead`: the planner's seat (budget.ahead), stepped on
        `wall_clock`, the clock the business calendar is on; `on_ahead_move(what, reason,
        before, after)`: told of each of its moves (the decision log's)."""
        self._policy = policy
        self._board = board
        self._quotas = quotas
        self._key_quotas = key_quotas
        self._kv = kv
        self._kv_cache_usage = kv_cache_usage
        self._metrics = metrics
        self._applied = applied
        self._ahead = ahead
        self._wall_clock = wall_clock
        self._on_ahead_move = on_ahead_move
        for tier, value in quotas.values.items():
            metrics.quotas.quota_multiplier(tier).set(value)

    async def step(self) -> None:
        policy = self._policy()
        score, memory_usage = self._board.fleet_load()  # the most loaded pool sets the pace
        if self._kv_cache_usage is not None:
            await self._kv.observe(policy, self._kv_cache_usage)
        for adjustment in self._quotas.step(score):
            tier = adjustment.what.split(":", 1)[1]
            direction = "shrink" if adjustment.after < adjustment.before else "grow"
            log.info(
                "quota multiplier %s %.2f -> %.2f (score %.2f, forecast %.2f)",
                tier,
                adjustment.before,
                adjustment.after,
                adjustment.inputs["score"],
                adjustment.inputs["forecast"],
            )
            self._metrics.quotas.quota_adjustments(tier, direction).inc()
            self._metrics.quotas.quota_multiplier(tier).set(adjustment.after)
        consumed = self._key_quotas.take_consumed()
        self._step_ahead(policy, consumed, score)
        for moved in self._kv.shares.step(policy, score, self._kv_cache_usage):
            _, tier, pool = moved.what.split(":", 2)
            if moved.after < moved.before:  # grows are small and frequent: the gauge shows them
                log.info(
                    "KV share lent to %s in pool %s called back %.2f -> %.2f (a tier above "
                    "waited %.0f%% of its wait, score %.2f)",
                    tier,
                    pool,
                    moved.before,
                    moved.after,
                    100 * moved.inputs["waited"],
                    moved.inputs["score"],
                )
            self._metrics.quotas.kv_lent(pool, tier).set(moved.after)
        await self._step_keys(list(policy.keys.values()), memory_usage, consumed)
        lowest = self._key_quotas.lowest_safety_factor()
        if lowest is not None:
            self._metrics.quotas.safety_factor.set(lowest)
        if score is not None:
            self._metrics.quotas.load_score("measured").set(score)
            forecast = self._quotas.forecaster.forecast(self._quotas.horizon)
            if forecast is not None:
                self._metrics.quotas.load_score("forecast").set(forecast)

    def _step_ahead(self, policy: Policy, consumed: dict[str, float], score: float | None) -> None:
        """The planner's interval: each tenant's demand (the weighted tokens its keys
        settled), its moves logged and counted, and what admission applies written."""
        planner = None if self._ahead is None else self._ahead.current(policy.ahead)
        if planner is None:
            if self._applied is not None:
                self._applied.update(self._quotas.values)
                self._kv.shares.caps.clear()
            return
        tiers = tenant_tiers(policy.keys.values())
        demand: dict[str, float] = {}
        counted: set[str] = set()
        for key in policy.keys.values():
            if key.budget_id not in counted:
                counted.add(key.budget_id)
                demand[key.tenant] = demand.get(key.tenant, 0.0) + consumed.get(key.budget_id, 0.0)
        for move in planner.step(self._wall_clock(), tiers, demand, score):
            self._note_ahead(move)
        if self._applied is not None:
            planner.apply(self._quotas.values, self._applied, self._kv.shares.caps)
        self._metrics.quotas.quota_ahead_raised.set(len(planner.raises))
        self._metrics.quotas.quota_ahead_lent.set(planner.config.lend if planner.lending else 1.0)
        for tier in ("sheddable", "standard"):
            self._metrics.quotas.quota_ahead_kv_share(tier).set(self._kv.shares.caps.get(tier, 1.0))

    def _note_ahead(self, move: Adjustment) -> None:
        log.info(
            "quota ahead %s: %s (%.2f -> %.2f; %s)",
            move.what.split(":", 1)[1],
            move.reason,
            move.before,
            move.after,
            ", ".join(f"{k} {v:.2f}" for k, v in sorted(move.inputs.items())),
        )
        self._metrics.quotas.quota_ahead_moves(reason_label(move.reason)).inc()
        if self._on_ahead_move is not None:
            self._on_ahead_move(move.what, move.reason, move.before, move.after)

    async def _step_keys(
        self,
        keys: list[ApiKey],
        memory_usage: float | None,
        consumed: dict[str, float] | None = None,
    ) -> None:
        """Every key's budget, in slices with the loop's other work between them: ten
        thousand keys took 80-280 ms in one go, and every request waited behind it (the
        only >20 ms answers of a 10,000-key policy, measured every 5 s). A tenant's demand
        is the sum of its keys'. `consumed`: the interval's, already taken (None: take it)."""
        if consumed is None:
            consumed = self._key_quotas.take_consumed()
        stepped: set[str] = set()
        counted: set[str] = set()
        demand: dict[str, tuple[float, float | None]] = {}
        for start in range(0, len(keys), KEYS_PER_SLICE):
            if start:
                await asyncio.sleep(0)
            chunk = keys[start : start + KEYS_PER_SLICE]
            self._key_quotas.step_keys(chunk, consumed, memory_usage, stepped)
            for key in chunk:
                measured = self._key_quotas.demand(key)
                if measured is None or key.budget_id in counted:
                    continue  # a tenant's shared budget counts once, not once per key
                counted.add(key.budget_id)
                # Summed under its label: the tenants without one of their own add up in "other".
                tenant = self._metrics.tenants.place(key.tenant_label)
                actual, forecast = demand.get(tenant, (0.0, None))
                if measured[1] is not None:
                    forecast = (forecast or 0.0) + measured[1]
                demand[tenant] = (actual + measured[0], forecast)
        self._key_quotas.retain(stepped)
        for tenant, (actual, forecast) in demand.items():
            self._metrics.tenant_demand(tenant, "actual").set(actual)
            if forecast is not None:
                self._metrics.tenant_demand(tenant, "forecast").set(forecast)
