"""What a finished request tells the engine picker: which engine served it (a fallback may
have), the engine it held is free again, and the engine's answer counts for (or against)
the engine's health.

What lives here: `EngineOutcomes`, an outcome sink (admission.chain.OutcomeSink) the
sidecar's access-log recorder and the simulator both feed. Pure: the picker and the fleet
keep the state (engines.picker, engines.state).
"""

from __future__ import annotations

import logging

from admission.decision import RequestOutcome
from engines.picker import EnginePicker

log = logging.getLogger("slogate.engines")


class EngineOutcomes:
    def __init__(self, picker: EnginePicker) -> None:
        self._picker = picker

    def record(self, outcome: RequestOutcome) -> None:
        if outcome.upstream and not outcome.upstream_failed:
            # A fallback answered: the prompt's prefix is cached there, not on the first.
            self._picker.served(outcome.tracking_id, outcome.upstream)
        self._picker.release(outcome.tracking_id)
        if not outcome.upstream:
            return
        # A 5xx the engine sent, or one Envoy made for it (refused, reset, timed out).
        failed = outcome.upstream_failed or outcome.status >= 500
        pool = outcome.decision.pool
        if self._picker.fleet.answered(pool, outcome.upstream, failed):
            log.warning(
                "engine %s of pool %s ejected: %d failed answers in a row",
                outcome.upstream,
                pool,
                self._picker.fleet_policy().engines.health.eject_after_errors,
            )
