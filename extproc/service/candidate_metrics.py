"""What the candidate policy would have done differently, as Prometheus metrics.

What lives here: `CandidateMetrics`, on the sidecar's registry (the catalogue, docs/sre/metrics.md):
- `slogate_candidate_decisions_total{tenant,verdict}`: every judged request, by verdict
  (same, would_refuse, would_admit, would_route, skipped);
- `slogate_candidate_would_refuse_total{tenant,reason}`: what the candidate would refuse,
  by its refusal reason (the rejections' reasons);
- `slogate_candidate_would_route_total{from_pool,to_pool}`;
- `slogate_candidate_active`: 1 while a candidate is loaded and judged;
- `slogate_candidate_loads_total{result}`: candidate loads, ok or refused.
`tenant` is folded as on the other tenant series (extproc.service.tenant_series): the
busiest `telemetry.tenant_series_max` tenants have their own, the rest `tenant="other"`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from extproc.service.loop_metrics import Family
from extproc.service.tenant_family import TenantFamily
from extproc.service.tenant_series import TenantSeries


class CandidateMetrics:
    def __init__(self, registry: CollectorRegistry, tenants: TenantSeries | None = None) -> None:
        # The sidecar's metrics' TenantSeries (SidecarMetrics.tenants), so one re-rank and
        # one cap hold for every tenant family.
        tenants = tenants or TenantSeries()
        self.decisions = TenantFamily(
            Counter(
                "slogate_candidate_decisions",
                "Requests judged under the candidate policy, by what it would have done",
                ["tenant", "verdict"],
                registry=registry,
            ),
            tenants,
        )
        self.would_refuse = TenantFamily(
            Counter(
                "slogate_candidate_would_refuse",
                "Requests the policy admitted and the candidate would refuse, by reason",
                ["tenant", "reason"],
                registry=registry,
            ),
            tenants,
        )
        self.would_route = Family(
            Counter(
                "slogate_candidate_would_route",
                "Requests both admit that the candidate would route to another pool",
                ["from_pool", "to_pool"],
                registry=registry,
            )
        )
        self.active = Gauge(
            "slogate_candidate_active",
            "1 while a candidate policy is loaded and judged beside the policy",
            registry=registry,
        )
        self.loads = Family(
            Counter(
                "slogate_candidate_loads",
                "Candidate policy loads: ok, or refused (the policy applies regardless)",
                ["result"],
                registry=registry,
            )
        )

    def candidate_verdict(
        self, tenant: str, verdict: str, reason: str, from_pool: str, to_pool: str
    ) -> None:
        self.decisions(tenant, verdict).inc()
        if verdict == "would_refuse":
            self.would_refuse(tenant, reason).inc()
        elif verdict == "would_route":
            self.would_route(from_pool, to_pool).inc()

    def candidate_loaded(self, active: bool, ok: bool) -> None:
        self.active.set(1 if active else 0)
        self.loads("ok" if ok else "refused").inc()
