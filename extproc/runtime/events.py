"""What the admission steps report, turned into the sidecar's metrics and quota inputs.

What lives here: `MetricsEvents`, which implements every step's narrow event interface
(admission.events) on the sidecar's Prometheus metrics, and feeds settled tokens to the
per-key dynamic quotas (budget.key_quotas).
"""

from __future__ import annotations

from admission.decision import RoutingDecision
from budget.key_quotas import KeyQuotas
from budget.ledger import Charge
from extproc.service.metrics import SidecarMetrics


class MetricsEvents:
    def __init__(self, metrics: SidecarMetrics, key_quotas: KeyQuotas) -> None:
        self._metrics = metrics
        self._key_quotas = key_quotas

    def shed(self, tier: str, reason: str) -> None:
        self._metrics.shed(tier, reason).inc()

    def probe(self, pool: str) -> None:
        self._metrics.breaker_probes(pool).inc()

    def footprint_ratio(self, pool: str, ratio: float) -> None:
        self._metrics.kv_footprint_ratio(pool).set(ratio)

    def waited(self, tier: str, outcome: str, seconds: float) -> None:
        self._metrics.wait_outcomes(tier, outcome).inc()
        if outcome != "full":
            self._metrics.wait_seconds(tier).observe(seconds)

    def budget_decision(self, tenant: str, result: str) -> None:
        self._metrics.budget_decisions(tenant, result).inc()

    def tokens_settled(self, decision: RoutingDecision, charge: Charge) -> None:
        self._metrics.tenant_tokens(decision.caller.tenant_label).inc(charge.raw_tokens)
        self._key_quotas.observe(decision.caller.budget_id, charge.weighted_tokens)
