"""The quota controller's metrics: tier multipliers, load score, the planner ahead of ramps
and the KV reserve lent to lower tiers.

What lives here: `QuotaMetrics`, which `SidecarMetrics` holds as `quotas` (one registry).
extproc.runtime.loops' QuotaLoop sets them each controller interval (budget.quotas,
budget.ahead, budget.lending).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from extproc.service.loop_metrics import Family, LoopCounter


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: list[str]) -> Family[Counter]:
            return Family(LoopCounter(name, doc, labels, registry=registry))

        def gauge(name: str, doc: str, labels: list[str]) -> Family[Gauge]:
            return Family(Gauge(name, doc, labels, registry=registry))

        self.quota_multiplier = gauge(
            "slogate_quota_multiplier",
            "Dynamic quota controller's budget multiplier per tier (1.0: full budgets).",
            ["tier"],
        )
        self.load_score = gauge(
            "slogate_load_score",
            "Controller load score (0.7 P99/SLO + 0.3 KV, saturation guards) as measured and "
            "as forecast.",
            ["kind"],
        )
        self.safety_factor = Gauge(
            "slogate_safety_factor",
            "Lowest per-key safety factor of the dynamic budgets (1.3, decaying to 1.1 "
            "while GPU/KV memory is over the emergency line).",
            registry=registry,
        )
        self.quota_adjustments = counter(
            "slogate_quota_adjustments_total",
            "Controller moves of a tier multiplier, by tier and direction (shrink, grow).",
            ["tier", "direction"],
        )
        # Quotas ahead of time (budget.ahead): its moves by reason, and what it holds now.
        self.quota_ahead_moves = counter(
            "slogate_quota_ahead_moves_total",
            "Moves of the quotas ahead of a ramp, by reason (forecast, calendar: raised; "
            "given_back; expired: the ramp did not come within lead + grace; lent: idle "
            "hours lent to the sheddable tier).",
            ["reason"],
        )
        self.quota_ahead_raised = Gauge(
            "slogate_quota_ahead_raised_tenants",
            "Tenants whose budgets are raised ahead of a forecast or declared ramp now.",
            registry=registry,
        )
        self.quota_ahead_kv_share = gauge(
            "slogate_quota_ahead_kv_share_cap",
            "The KV share a tier is capped at while headroom is reserved for a ramp (1: none).",
            ["tier"],
        )
        self.quota_ahead_lent = Gauge(
            "slogate_quota_ahead_lent",
            "The factor on the sheddable tier's multiplier while idle hours are lent (1: none).",
            registry=registry,
        )
        self.kv_lent = gauge(
            "slogate_kv_lent",
            "Share of the pool's KV cache lent to a tier on top of its kv_shares while no "
            "tier above waits for room (budget.lending); 0: nothing lent.",
            ["pool", "tier"],
        )
