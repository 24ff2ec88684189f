"""What the admission steps report, each through the narrow interface it declares.

What lives here: one Protocol per step (what it tells the outside world: a request shed, a
probe let through, a footprint ratio learned, a request leaving the waiting room, a budget
decision, tokens settled) and `NoEvents`, which hears them all and does nothing (the
simulator, tests). The sidecar's metrics implement them (extproc.runtime.events); no step
sees the metrics object.
"""

from __future__ import annotations

from typing import Protocol

from admission.decision import RoutingDecision
from budget.ledger import Charge


class BreakerEvents(Protocol):
    def shed(self, tier: str, reason: str) -> None: ...
    def probe(self, pool: str) -> None: ...


class KvEvents(Protocol):
    def footprint_ratio(self, pool: str, ratio: float) -> None: ...

    def waited(self, tier: str, outcome: str, seconds: float) -> None:
        """A request left the waiting room: dispatched, timed_out, cancelled (or was refused
        at its door: full, 0 s)."""
        ...


class BudgetEvents(Protocol):
    def budget_decision(self, tenant: str, result: str) -> None: ...
    def tokens_settled(self, decision: RoutingDecision, charge: Charge) -> None: ...


class NoEvents:
    def shed(self, tier: str, reason: str) -> None:
        pass

    def probe(self, pool: str) -> None:
        pass

    def footprint_ratio(self, pool: str, ratio: float) -> None:
        pass

    def waited(self, tier: str, outcome: str, seconds: float) -> None:
        pass

    def budget_decision(self, tenant: str, result: str) -> None:
        pass

    def tokens_settled(self, decision: RoutingDecision, charge: Charge) -> None:
        pass
