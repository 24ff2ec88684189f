"""The global ledger's lease arithmetic: each region's share of every global tenant's budget.

What lives here: the report a region sends and the lease it gets back (`Report`, `Lease`),
the ledger's book (`LedgerBook`), and `apply_report`, the one rule that turns a report into
a lease. Pure: no I/O, no clock (the caller passes `now_s`). The Redis side runs the same
rule in budget/lua/lease_report.lua; budget.global_ledger holds both behind one protocol,
budget.lease_holder is the region's side. The design: docs/contributors/regions.md.

**The guarantee** (one sentence, for operators): across all regions a global tenant's
rates and concurrency never exceed its global limits by more than one unit per bucket per
region, and its spend in a window never exceeds the window's limit by more than one
request per region (each region's buckets are its lease's share of the limits, and the
shares the ledger holds for a tenant never sum past 1, nor its spend ceilings past the
limit, through reordered, repeated or lost reports and partitions); budget a region does
not use flows back to the others at that region's next report (a dead region's share after
its lease plus `fallback_for_s`; its unused spend ceiling only when the window ends).

Why it holds:

- Shares: `held` (what the ledger keeps for a region) is `max(the share the region says it
  enforces, the new grant)`, the grant is at most `1 - what the others hold`, and a hold only
  falls with time (the share until the lease ends, then the fallback share, at most the
  share, for `fallback_for_s`, then 0). So the holds of a tenant sum to at most 1 at every
  instant. A region measures its lease from when it *sent* the report, the ledger from
  when it received it: the region's lease and fallback end first. Its token buckets hold at
  most `share x limit` and refill at `share x rate`, so the regions' buckets together hold
  and refill no more than one bucket at the global limit would; `scale_limits` floors each
  bucket at 1, which adds at most 1 per bucket per region.
- Spend: a window's spend is permanent, so the ledger grants each region an absolute
  **ceiling** (the region's spend may reach it) and holds the ceilings so that they never
  sum past the limit: `ceiling = own + share x (limit - global spent)`, capped at `limit -
  what the others hold` (their ceilings, or their spend where larger), never below the
  region's own spend. A spend window admits past its limit by at most one request (its
  check is on the reserve), so the fleet's spend exceeds the limit by at most one request
  per region. A ceiling stays held until the region's next report lowers it: a region that
  falls silent may have spent up to it, which nobody can know until it reports again.
  (The share-of-the-remaining rule alone, without the cap, overshoots: regions that report
  in turn each see the others' spend one interval stale; two regions can reach 1.25x.)

Demand is smoothed by a **peak with halving decay** on the ledger's clock: at its report a
region's demand becomes `max(reported, previous x 0.5^(t / report_interval_s))`, `t` the
time since its previous report. A region that starts needing a tenant's budget weighs in
at its next report, with no lag; one that goes quiet for one interval keeps half its
weight, so one quiet interval does not hand its share away. The targets compare each
live region's demand as it stands for the interval after its report (it is that
interval's rate), decaying at the same rate only once a region has missed a report: so
the split does not depend on the order of the reports. (Decaying on report counts alone,
the region reporting first always looked quieter: the shares of an idle tenant summed to
0.9, 0.1 held by nobody.) Demand that has decayed below `IDLE_DEMAND` everywhere is none:
the tenant's regions share equally. An EWMA would also lag the rise, which is the moving
tenant's wait.

A tenant moving from region A to region B (A's demand drops to 0, B's takes the whole):
B's lease reaches 0.9 of the limit within `MOVE_REPORTS` = 7 report intervals (with
min_share 0.05, two regions, each reporting once per interval at any moment of it): A's
held share must fall to <= 0.1, which takes A's weight `0.5^t <= 0.0588` (t >= 4.1
intervals of A's silence, as A's own report sees it; A enforces its previous grant until
the answer, so the ledger holds that one interval longer); then B's next report takes the
room. The worst of 300 random report orders took 7 (tests/budget/test_leases.py checks 20).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policy._regions import LedgerConfig

# Shares are floats; sums of them may exceed 1 by rounding, never by more than this.
EPSILON = 1e-9
# A region's smoothed demand falls by this factor per report interval without demand.
DEMAND_DECAY = 0.5
# Weighted tokens per interval under which a tenant's demand, everywhere, counts as none.
IDLE_DEMAND = 0.5
# Report intervals for a moved tenant to reach 0.9 of its limit in its new region (above).
MOVE_REPORTS = 7


@dataclass(frozen=True, slots=True)
class TenantReport:
    tenant: str
    demand: float  # weighted tokens reserved + refused this interval, whole region
    usage: float  # cumulative weighted tokens settled by the region (never reset)
    spend: Mapping[str, float]  # window key ("day:2026-12-05", "month:2026-12") -> spent
    applied: float  # the share the region enforces now (0 before its first lease)
    # Window key -> the window's global spend limit, as this region's policy says; a window
    # without one gets no ceiling (the tenant has no spend budget there).
    spend_limit: Mapping[str, float] = field(default_factory=dict)
    # Window key -> the spend ceiling the region enforces now (LeaseHolder.spend_ceilings).
    spend_applied: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolRoom:  # for crossing: what a region says of its pools
    level: int  # breaker level 0..3
    waiting_full: bool


@dataclass(frozen=True, slots=True)
class Report:
    region: str
    # Increases per report from this region. A report not newer than the stored seq is
    # answered from the stored state with lease_s 0 (it grants nothing); the region's next
    # report uses that lease's seq + 1 (a restarted holder learns the seq that way).
    seq: int
    tenants: tuple[TenantReport, ...]
    pools: Mapping[str, PoolRoom] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TenantLease:
    share: float
    global_usage: float  # sum of every region's cumulative usage
    global_spend: Mapping[str, float]  # window key -> sum of every region's spend
    # Window key -> the spend this region may reach in the window (absolute, not a delta).
    spend_ceiling: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lease:
    region: str
    seq: int
    lease_s: float  # 0: the report was not newer than the stored one; nothing is granted
    tenants: Mapping[str, TenantLease]
    peers: Mapping[str, Mapping[str, PoolRoom]]  # other live regions -> their pools' room
    rebalanced: int  # how many tenants' shares changed in this report


@dataclass(frozen=True, slots=True)
class LeaseSettings:  # from policy.regions.ledger
    lease_s: float
    fallback_for_s: float
    min_share: float
    # A cut-off region's share after its lease: at most this (None: the share it held).
    fallback_share: float | None = None
    report_interval_s: float = 1.0  # the demand's decay runs on this period

    @classmethod
    def of(cls, ledger: LedgerConfig) -> LeaseSettings:
        return cls(
            ledger.lease_s,
            ledger.fallback_for_s,
            ledger.min_share,
            ledger.fallback_share,
            ledger.report_interval_s,
        )


@dataclass(slots=True)
class RegionTenant:
    """One region's record of one tenant in the book."""

    demand: float = 0.0  # smoothed (DEMAND_DECAY), as of demand_at
    demand_at: float = 0.0
    usage: float = 0.0  # as last reported (cumulative)
    spend: dict[str, float] = field(default_factory=dict)  # window -> as last reported
    windows: tuple[str, ...] = ()  # the windows of the region's last report
    ceiling: dict[str, float] = field(default_factory=dict)  # window -> spend ceiling held
    held: float = 0.0  # the share held for the region until expires_s
    granted: float = 0.0  # the share last granted (the lease's)
    fallback: float = 0.0  # the share held from expires_s until fallback_until_s
    expires_s: float = 0.0
    fallback_until_s: float = 0.0

    def hold(self, now_s: float) -> float:
        """The share held for the region at `now_s`: non-increasing in time."""
        if now_s < self.expires_s:
            return self.held
        if now_s < self.fallback_until_s:
            return self.fallback
        return 0.0


@dataclass(slots=True)
class RegionEntry:
    seq: int = -1
    pools: dict[str, PoolRoom] = field(default_factory=dict)
    expires_s: float = 0.0  # live (a peer for crossing) until then


@dataclass(slots=True)
class LedgerBook:
    regions: dict[str, RegionEntry] = field(default_factory=dict)
    tenants: dict[str, dict[str, RegionTenant]] = field(default_factory=dict)  # -> region ->


def decayed_demand(rec: RegionTenant, now_s: float, interval_s: float, grace_s: float) -> float:
    """The region's smoothed demand as of `now_s`, decaying once `grace_s` has passed
    since its report."""
    return rec.demand * DEMAND_DECAY ** (max(0.0, now_s - rec.demand_at - grace_s) / interval_s)


def target_share(
    regions: Mapping[str, RegionTenant], region: str, now_s: float, settings: LeaseSettings
) -> float:
    """`region`'s target among the tenant's live regions (lease not expired): `min_share`
    each, the rest by their demands decayed to `now_s`; equal shares while nobody has
    demand."""
    interval_s = settings.report_interval_s
    demands = {
        name: decayed_demand(rec, now_s, interval_s, interval_s)
        for name, rec in sorted(regions.items())  # the Lua's order: the same float sum
        if rec.expires_s > now_s
    }
    total = sum(demands.values())
    if total < IDLE_DEMAND or len(demands) * settings.min_share >= 1.0:
        return 1.0 / len(demands)
    return settings.min_share + (1.0 - len(demands) * settings.min_share) * demands[region] / total


def apply_report(book: LedgerBook, report: Report, now_s: float, settings: LeaseSettings) -> Lease:
    """Record `report` in `book` (changed in place) and answer the reporting region's lease."""
    entry = book.regions.get(report.region)
    if entry is not None and report.seq <= entry.seq:
        return _stored_lease(book, report, entry.seq, now_s)
    if entry is None:
        entry = book.regions[report.region] = RegionEntry()
    entry.seq = report.seq
    entry.pools = dict(report.pools)
    entry.expires_s = now_s + settings.lease_s
    tenants: dict[str, TenantLease] = {}
    rebalanced = 0
    for line in report.tenants:
        regions = book.tenants.setdefault(line.tenant, {})
        own = regions.setdefault(report.region, RegionTenant())
        before = own.hold(now_s)
        own.demand = max(
            max(0.0, line.demand), decayed_demand(own, now_s, settings.report_interval_s, 0.0)
        )
        own.demand_at = now_s
        own.usage = float(line.usage)
        own.spend.update({window: float(spent) for window, spent in line.spend.items()})
        own.windows = tuple(sorted(set(line.spend) | set(line.spend_limit)))
        own.expires_s = now_s + settings.lease_s
        own.fallback_until_s = own.expires_s + settings.fallback_for_s
        others = sum(rec.hold(now_s) for name, rec in regions.items() if name != report.region)
        target = target_share(regions, report.region, now_s, settings)
        grant = max(0.0, min(target, 1.0 - others))
        if abs(grant - own.granted) > EPSILON:
            rebalanced += 1
        own.granted = grant
        # It keeps enforcing what it applied until this answer reaches it; never more than
        # was held for it (a late report's `applied` may be one its own lease has ended).
        own.held = max(min(max(0.0, line.applied), before), grant)
        own.fallback = (
            own.held if settings.fallback_share is None else min(settings.fallback_share, own.held)
        )
        _drop_ended_windows(regions, now_s)
        ceilings = _grant_ceilings(regions, report.region, line, grant)
        tenants[line.tenant] = _tenant_lease(regions, grant, ceilings)
    return Lease(
        region=report.region,
        seq=report.seq,
        lease_s=settings.lease_s,
        tenants=tenants,
        peers=_peers(book, report.region, now_s),
        rebalanced=rebalanced,
    )


def _grant_ceilings(
    regions: Mapping[str, RegionTenant], region: str, line: TenantReport, grant: float
) -> dict[str, float]:
    own = regions[region]
    granted: dict[str, float] = {}
    held: dict[str, float] = {}
    for window, limit in sorted(line.spend_limit.items()):
        own_spent = own.spend.get(window, 0.0)
        global_spent = sum(rec.spend.get(window, 0.0) for rec in regions.values())
        others = sum(
            max(rec.spend.get(window, 0.0), rec.ceiling.get(window, 0.0))
            for name, rec in regions.items()
            if name != region
        )
        target = own_spent + grant * max(0.0, limit - global_spent)
        ceiling = max(own_spent, min(target, limit - others))
        granted[window] = ceiling
        applied = min(line.spend_applied.get(window, 0.0), own.ceiling.get(window, 0.0))
        held[window] = max(applied, ceiling)
    own.ceiling = held
    return granted


def _drop_ended_windows(regions: Mapping[str, RegionTenant], now_s: float) -> None:
    """Forget a spend window once no live region reports it any more (it has ended
    everywhere; a region whose clock rolled first still counts in it until then)."""
    current = {w for rec in regions.values() if rec.expires_s > now_s for w in rec.windows}
    for rec in regions.values():
        for window in [w for w in rec.spend if w not in current]:
            del rec.spend[window]
        for window in [w for w in rec.ceiling if w not in current]:
            del rec.ceiling[window]


def _tenant_lease(
    regions: Mapping[str, RegionTenant], share: float, ceilings: Mapping[str, float]
) -> TenantLease:
    spend: dict[str, float] = {}
    for rec in regions.values():
        for window, spent in rec.spend.items():
            spend[window] = spend.get(window, 0.0) + spent
    return TenantLease(
        share=share,
        global_usage=sum(rec.usage for rec in regions.values()),
        global_spend=spend,
        spend_ceiling=dict(ceilings),
    )


def _peers(book: LedgerBook, region: str, now_s: float) -> dict[str, Mapping[str, PoolRoom]]:
    return {
        name: dict(entry.pools)
        for name, entry in sorted(book.regions.items())
        if name != region and entry.expires_s > now_s
    }


def _stored_lease(book: LedgerBook, report: Report, seq: int, now_s: float) -> Lease:
    """The answer to a report that is not newer than the stored one: what is stored for the
    report's tenants, with lease_s 0, so the region extends nothing on it (its lease could
    outlive the stored hold)."""
    tenants: dict[str, TenantLease] = {}
    for line in report.tenants:
        regions = book.tenants.get(line.tenant, {})
        if report.region in regions:
            tenants[line.tenant] = _tenant_lease(regions, regions[report.region].granted, {})
    return Lease(report.region, seq, 0.0, tenants, _peers(book, report.region, now_s), 0)
