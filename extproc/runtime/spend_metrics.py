"""What the spend step reports (admission.spend_step.SpendEvents), as Prometheus metrics.

What lives here: `SpendMetrics`, on the sidecar's registry:
- `slogate_tenant_spend_used_ratio{tenant,window}`: spent + held over the limit, as the
  store last answered this replica (replicas agree to within their last requests: take the
  max over replicas). One series per tenant with a spend budget and window: 1,000 tenants
  with day and month budgets are 2,000 series.
- `slogate_tenant_spend_warnings_total{tenant,window,threshold}`: a window crossing 80% or
  100% (each crossing happens in one atomic store call, so on one replica only: sum them).
- `slogate_tenant_spend_unverified_total{tenant,action,cause}`: a spend check the store did
  not answer (`cause` timeout: slower than `budget.spend_timeout_ms`; error: away), and
  what the request got (`action` admitted or refused, as `budget.spend_unverified` says).
- `slogate_spend_settlements_waiting`: settlements the store could not take yet, retried
  each second (admission.spend_step.SpendStep.reconcile);
  `slogate_spend_settlements_retried_total{result}`: those it then took (settled) or that
  were given up (lost: past their deadline or over the backlog's bound).
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
        self.unverified = Counter(
            "slogate_tenant_spend_unverified",
            "Spend checks the spend store did not answer (cause: timeout or error), and "
            "what the request got (action: admitted or refused)",
            ["tenant", "action", "cause"],
            registry=registry,
        )
        self.waiting = Gauge(
            "slogate_spend_settlements_waiting",
            "Spend settlements the spend store could not take yet, waiting to be retried",
            registry=registry,
        )
        self.retried = Counter(
            "slogate_spend_settlements_retried",
            "Spend settlements retried from the backlog: taken by the store (settled) or "
            "given up (lost)",
            ["result"],
            registry=registry,
        )
        for result in ("settled", "lost"):
            self.retried.labels(result)

    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None:
        self.used_ratio.labels(tenant, window).set(share)
        for threshold in WARNING_SHARES:
            if before < threshold <= share:
                self.warnings.labels(tenant, window, f"{threshold:g}").inc()

    def spend_unverified(self, tenant: str, action: str, cause: str) -> None:
        self.unverified.labels(tenant, action, cause).inc()

    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None:
        self.waiting.set(waiting)
        if settled:
            self.retried.labels("settled").inc(settled)
        if lost:
            self.retried.labels("lost").inc(lost)
