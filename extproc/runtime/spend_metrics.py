"""What the spend step reports (admission.spend_step.SpendEvents), as Prometheus metrics.

What lives here: `SpendMetrics`, on the sidecar's registry:
- `slogate_tenant_spend_used_ratio{tenant,window}`: spent + held over the limit, as the
  store last answered this replica (replicas agree to within their last requests: take the
  max over replicas). One series per tenant with a spend budget and window: 1,000 tenants
  with day and month budgets are 2,000 series.
- `slogate_tenant_spend_warnings_total{tenant,window,threshold}`: a window crossing 80% or
  100% (each crossing happens in one atomic store call, so on one replica only: sum them).
- `slogate_tenant_spend_unchecked_total{tenant}`: admitted without a check (store away).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from budget.spend import WARNING_SHARES


class SpendMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.used_ratio = Gauge(
            "slogate_tenant_spend_used_ratio",
            "A tenant's spend budget window: spent plus held for requests in flight, over its "
            "limit (past 1 when the last request settled beyond it)",
            ["tenant", "window"],
            registry=registry,
        )
        self.warnings = Counter(
            "slogate_tenant_spend_warnings",
            "A tenant's spend budget window crossing a warning share (0.8, 1.0)",
            ["tenant", "window", "threshold"],
            registry=registry,
        )
        self.unchecked = Counter(
            "slogate_tenant_spend_unchecked",
            "Requests admitted without a spend check: the spend store did not answer",
            ["tenant"],
            registry=registry,
        )

    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None:
        self.used_ratio.labels(tenant, window).set(share)
        for threshold in WARNING_SHARES:
            if before < threshold <= share:
                self.warnings.labels(tenant, window, f"{threshold:g}").inc()

    def spend_unchecked(self, tenant: str) -> None:
        self.unchecked.labels(tenant).inc()
