"""What the region agent shows: its metrics, and the region's view for `slogate status`.

What lives here: `RegionMetrics` (on the sidecar's registry; the region agent,
extproc.runtime.region_agent, sets them each report interval) and `RegionView` /
`TenantLeaseView`, the region as the admin API's Status reads it. The tenant label goes
through the sidecar's tenant label bounding (extproc.service.tenant_series), like every
tenant-labelled series.

- `slogate_region_lease_share{tenant}`: the share of a global tenant's limits this region
  enforces now (every replica reads the same lease).
- `slogate_region_usage_tokens_total{tenant}`: weighted tokens this replica settled for a
  global tenant (sum the replicas for the region's usage).
- `slogate_region_rebalances_total`: tenants whose share changed in a report (the lease
  holder's).
- `slogate_region_ledger_state{state}`: 1 for the region's state with the global ledger
  (leased, cut_off: its report went unanswered but its lease holds, fallback, closed,
  none: no lease yet), 0 for the others.
- `slogate_region_report_seconds`: a report's round trip to the global ledger (the lease
  holder's; a report that timed out is not observed: the state says so).
- `slogate_region_lease_expires_in_seconds`: until the region's lease expires (negative:
  expired; the fallback, then closed).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extproc.service.loop_metrics import LoopCounter, LoopHistogram
from extproc.service.tenant_family import TenantFamily
from extproc.service.tenant_series import TenantSeries

# The states LeaseHolder.state answers (budget.lease_holder).
LEDGER_STATES = ("leased", "cut_off", "fallback", "closed", "none")
_REPORT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class TenantLeaseView:
    tenant: str
    share: float | None  # None: no lease for it yet
    usage: float  # the region's cumulative weighted tokens, as last reported
    global_usage: float | None  # every region's, as of the lease


@dataclass(frozen=True, slots=True)
class RegionView:
    region: str
    state: str  # one of LEDGER_STATES
    holder: bool  # this replica reports for the region
    seq: int  # the lease's report number (0: none yet)
    lease_expires_in_s: float | None  # None: no lease yet
    tenants: tuple[TenantLeaseView, ...]


class RegionMetrics:
    def __init__(self, registry: CollectorRegistry, tenants: TenantSeries) -> None:
        self.share = TenantFamily(
            Gauge(
                "slogate_region_lease_share",
                "The share of a global tenant's limits this region enforces now (from its "
                "lease of the global ledger).",
                ["tenant"],
                registry=registry,
            ),
            tenants,
        )
        self.usage = TenantFamily(
            LoopCounter(
                "slogate_region_usage_tokens",
                "Weighted tokens this replica settled for a global tenant (sum the replicas: "
                "the region's usage it reports to the global ledger).",
                ["tenant"],
                registry=registry,
            ),
            tenants,
        )
        self.rebalances: Counter = LoopCounter(
            "slogate_region_rebalances",
            "Global tenants whose share of this region changed in a report to the global ledger.",
            registry=registry,
        )
        self.state = Gauge(
            "slogate_region_ledger_state",
            "The region's state with the global ledger: 1 for the current one (leased, "
            "cut_off: unanswered but its lease holds, fallback, closed, none: no lease yet).",
            ["state"],
            registry=registry,
        )
        for state in LEDGER_STATES:
            self.state.labels(state).set(1 if state == "none" else 0)
        self.report_seconds: Histogram = LoopHistogram(
            "slogate_region_report_seconds",
            "A report's round trip to the global ledger (the region's lease holder).",
            buckets=_REPORT_BUCKETS_S,
            registry=registry,
        )
        self.expires_in = Gauge(
            "slogate_region_lease_expires_in_seconds",
            "Seconds until this region's lease of the global ledger expires (negative: "
            "expired, serving on its fallback or closed).",
            registry=registry,
        )

    def ledger_state(self, current: str) -> None:
        for state in LEDGER_STATES:
            self.state.labels(state).set(1 if state == current else 0)
