"""The breaker as an admission step: the shedding table applied to each request.

What lives here: `BreakerStep`. It reads the level the board holds for the request's pool
(breaker.board: its pool's or the global one, whichever is higher), applies the shedding
table (breaker.shedding): admit, refuse with Retry-After (429 for the sheddable tier, the
endpoint picker protocol's answer for traffic to drop; 503 for the others), or re-route critical
traffic to the fallback pool with the fallback model at L3; in half-open it lets
`probe_fraction` of what it would shed through as probes. The level goes into the decision,
so the budget step scales limits by it and settlement uses the same level. It holds
nothing, so releasing and settling are no-ops. At the policy's
`regions.crossing.from_level` and above, a latency-tolerant request is first offered to a
peer region with room (admission.crossing): re-routed there, it is neither shed nor
re-routed here. Evaluating the board and exporting its state is the sidecar's loop
(extproc.runtime.loops), not this step's.
"""

from __future__ import annotations

import dataclasses
import math
import random

from admission.crossing import Crossing
from admission.decision import DEGRADED_HEADER, Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import Overloaded, Shed
from admission.events import BreakerEvents
from breaker.board import BreakerBoard
from breaker.levels import BreakerLevel
from breaker.shedding import Action, shed
from policy.domain import Tier

_MESSAGES = {
    "long_context_shed": "Long-context requests of this priority are paused while the "
    "inference fleet is under load. Retry later or send a shorter request.",
    "tier_shed": "Requests of this priority are paused while the inference fleet recovers.",
    "context_capped": "The context of requests of this priority is temporarily capped at "
    "8192 tokens (prompt + max_tokens) while the inference fleet is under load.",
}


class BreakerStep:
    def __init__(
        self,
        board: BreakerBoard,
        events: BreakerEvents,
        rng: random.Random | None = None,
        crossing: Crossing | None = None,
    ) -> None:
        self._crossing = crossing
        self._board = board
        self._events = events
        self._rng = rng or random.Random()

    async def admit(self, applicant: Applicant) -> Admitted:
        decision, policy = applicant.decision, applicant.policy
        if not decision.meters_tokens:
            return Admitted(decision)  # tokenize, the model list: nothing to shed
        level = self._board.level(decision.pool)
        if level is not decision.level:
            decision = dataclasses.replace(decision, level=level)
        if self._crossing is not None and level is not BreakerLevel.L0:
            crossed = self._crossing.reroute(
                dataclasses.replace(applicant, decision=decision), int(level), False
            )
            if crossed is not None:
                return Admitted(crossed)
        verdict = shed(level, decision.caller.tier, decision.context_tokens)
        if verdict.action is Action.ADMIT:
            return Admitted(decision)
        tier = decision.caller.tier.value
        if verdict.action is Action.REROUTE:
            self._events.shed(tier, verdict.reason)
            rerouted = dataclasses.replace(
                decision, pool=policy.fallback_pool, model_override=policy.fallback_model
            )
            return Admitted(rerouted, {DEGRADED_HEADER: f"L{int(level)}"})
        probe_fraction = policy.breaker.thresholds.probe_fraction
        if self._board.probing(decision.pool) and self._rng.random() < probe_fraction:
            # Half-open: a few of the requests this level sheds are let through as probes.
            self._events.probe(decision.pool)
            return Admitted(decision)
        self._events.shed(tier, verdict.reason)
        refusal = Shed if decision.caller.tier is Tier.SHEDDABLE else Overloaded
        raise refusal(
            _MESSAGES[verdict.reason],
            reason=f"shed_{verdict.reason}",
            retry_after_s=math.ceil(self._board.retry_after_s(decision.pool)),
        )

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """Nothing is held."""

    async def settle(self, outcome: RequestOutcome) -> None:
        """Nothing is held; the breaker learns from the signals, not from here."""
