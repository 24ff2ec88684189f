"""The breaker on the request path, and its loop: evaluate, export, drill.

What lives here: `BreakerGate`, the Admission that applies the shedding table to each
request at its pool's level (503 + Retry-After, or the fallback pool with the fallback
model at L3, or a probe in half-open), and `BreakerLoop`, which evaluates the board on
an interval, exports levels / transitions / signals to Prometheus, and applies drills.

Drills come through the admin API (`slogate drill`): a minimum level on one pool (or
"global") for a number of minutes, visible in metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable

from breaker.board import BreakerBoard
from breaker.levels import BreakerLevel, Transition
from breaker.shedding import Action, shed
from extproc.errors import Overloaded
from extproc.metrics import SidecarMetrics
from extproc.request_flow import Admitted, RoutingDecision
from policy import Policy

log = logging.getLogger("slogate.breaker")

_MESSAGES = {
    "long_context_shed": "Long-context requests of this priority are paused while the "
    "inference fleet is under load. Retry later or send a shorter request.",
    "tier_shed": "Requests of this priority are paused while the inference fleet recovers.",
    "context_capped": "The context of requests of this priority is temporarily capped at "
    "8192 tokens (prompt + max_tokens) while the inference fleet is under load.",
}


class BreakerGate:
    def __init__(
        self,
        board: BreakerBoard,
        policy: Callable[[], Policy],
        metrics: SidecarMetrics,
        rng: random.Random | None = None,
    ) -> None:
        self._board = board
        self._policy = policy
        self._metrics = metrics
        self._rng = rng or random.Random()

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        if not decision.meters_tokens:
            return Admitted(decision)  # tokenize, the model list: nothing to shed
        level = self._board.level(decision.pool)
        verdict = shed(level, decision.caller.tier, decision.context_tokens)
        if verdict.action is Action.ADMIT:
            return Admitted(decision)
        tier = decision.caller.tier.value
        if verdict.action is Action.REROUTE:
            policy = self._policy()
            self._metrics.shed(tier, verdict.reason).inc()
            rerouted = dataclasses.replace(
                decision, pool=policy.fallback_pool, model_override=policy.fallback_model
            )
            return Admitted(rerouted, {"x-slogate-degraded": f"L{int(level)}"})
        probe_fraction = self._policy().breaker.thresholds.probe_fraction
        if self._board.probing(decision.pool) and self._rng.random() < probe_fraction:
            # Half-open: a few of the requests this level sheds are let through as probes.
            self._metrics.breaker_probes(decision.pool).inc()
            return Admitted(decision)
        self._metrics.shed(tier, verdict.reason).inc()
        raise Overloaded(
            _MESSAGES[verdict.reason],
            reason=f"shed_{verdict.reason}",
            retry_after_s=math.ceil(self._board.retry_after_s(decision.pool)),
        )


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
        self._on_transition = on_transition

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
            if self._on_transition is not None:
                self._on_transition(transition)
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
