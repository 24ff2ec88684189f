"""Which tenants keep a series of their own in the tenant-labelled metrics; the rest are
folded into `tenant="other"`.

What lives here: `TenantSeries` (the fold, the traffic count behind it and its re-rank) and
`declared_tenants` (the tenants a policy names). Pure: no Prometheus, no clock, no I/O.
The metrics (extproc.service.metrics.TenantFamily) ask `label()` for every tenant label and
remove the series of the tenants a re-rank evicts; the sidecar calls `rerank()` every
`RERANK_INTERVAL_S`.

Why: a tenant label is a policy tenant or, for a JWT caller, whatever its tenant claim says;
ten thousand subjects would be ten thousand series per tenant family (a histogram's are
twenty buckets each). The cap, `telemetry.tenant_series_max`, is the number of tenants with
their own label (the llm-d endpoint picker folds past 1,000 too); `other` is one more.

The rules:
- Room first: while fewer than `cap` tenants hold a series, a new tenant gets one at once.
  A fleet with fewer tenants than the cap never folds anything and never re-ranks anyone.
- "Top by traffic": `label()` counts one for its tenant; the metrics call it once per
  request (its budget decision) and `place()`, which counts nothing, for the request's
  other tenant series and for gauges. Counts halve at each re-rank, so they weigh the last
  few intervals, not the process's lifetime.
- Bounded: at most `TABLE_FACTOR x cap` tenants are counted. A newcomer that finds the
  table full drops the tenants counted once or less (a flood of one-off subjects; one
  O(table) pass per table's worth of them), as lossy counting does: a tenant with more
  than about 1 / (TABLE_FACTOR x cap) of the traffic, 0.025% at the default cap, stays
  counted through any flood. If that frees too little (a table of tenants all busier than
  that), newcomers fold into `other` uncounted until the re-rank prunes the table back to
  its `PRUNED_FACTOR x cap` busiest.
- Re-rank: the policy's declared tenants take their places first (they are few and known,
  and an operator expects their series to stay), then the rest by count, where a tenant
  that already holds a series counts double: a newcomer displaces it only with more than
  twice its traffic, so two tenants of about equal traffic do not swap places every minute;
  and a newcomer seen only once competes for no place, so a flood of one-off subjects does
  not churn a thousand series a minute.
- Eviction: an evicted tenant's series are removed (prometheus_client `remove()`), and it
  counts into `other` from then on; if it wins a place again its counters start again at
  0. Prometheus's `rate()` and `increase()` take such a reset as one, as they do a restart.
- `other` is a label like any: a tenant actually called "other" shares it.

Workers (`serve --workers N`): each worker folds on its own, on the traffic it sees, and
the supervisor's merged /metrics is the union of the workers' labels, so the bound is N x
cap + 1 tenant values per family. The kernel spreads connections, not tenants, over the
workers, so each sees about the same mix and ranks the same tenants first; but the places
first come took differ (a flood of one-off subjects gives each worker a different
thousand), so past the cap the union approaches N x cap. Folding again in the supervisor
would make `other` a sum over a changing set of tenants, a counter that goes down (a
reset to `rate()`) whenever one left it; an operator who needs a fleet total sets the cap
to that total over N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from policy.schema import Policy

OTHER = "other"
RERANK_INTERVAL_S = 60.0
TABLE_FACTOR = 4  # tenants counted at most, times the cap
PRUNED_FACTOR = 2  # tenants kept in the count after a re-rank, times the cap
INCUMBENT_WEIGHT = 2.0  # a series holder's count weighs this much at a re-rank


def declared_tenants(policy: Policy) -> frozenset[str]:
    """The tenants a policy names: its `tenants:` list and the tenants of its keys."""
    return frozenset(policy.tenants.listed) | {key.tenant for key in policy.keys.values()}


class TenantSeries:
    """The tenants that hold their own series, at most `cap` of them."""

    def __init__(self, cap: int = 1000) -> None:
        self._cap = cap
        self._table_max = TABLE_FACTOR * cap
        self._kept: set[str] = set()
        self._counts: dict[str, float] = {}
        self._may_purge = True  # False: a purge freed too little; wait for the re-rank
        # Called with the tenants a re-rank evicts, to remove their series.
        self.on_evict: list[Callable[[Iterable[str]], None]] = []

    @property
    def cap(self) -> int:
        return self._cap

    @property
    def kept(self) -> frozenset[str]:
        return frozenset(self._kept)

    @property
    def counted(self) -> int:
        """Tenants whose traffic is counted now (at most TABLE_FACTOR x cap)."""
        return len(self._counts)

    def label(self, tenant: str) -> str:
        """The label `tenant`'s series go under, counting one request for it: the request
        path's call (two dict lookups, then `place`'s set lookup)."""
        counts = self._counts
        seen = counts.get(tenant)
        if seen is not None:
            counts[tenant] = seen + 1.0
        elif len(counts) < self._table_max or self._purge_one_offs():
            self._counts[tenant] = 1.0
        # One placement rule for counted and uncounted touches; the call costs ~25 ns.
        return self.place(tenant)

    def _purge_one_offs(self) -> bool:
        """Drop the tenants counted once or less; whether that made room for more."""
        if not self._may_purge:
            return False
        self._counts = {t: n for t, n in self._counts.items() if n > 1.0}
        freed = self._table_max - len(self._counts)
        self._may_purge = freed * 4 >= self._table_max  # a quarter or more: worth another
        return freed > 0

    def place(self, tenant: str) -> str:
        """The label `tenant`'s series go under, counting nothing: for the series a request
        touches besides the one that counts it, and for gauges, which are not traffic."""
        if tenant in self._kept:
            return tenant
        if len(self._kept) < self._cap:
            self._kept.add(tenant)
            return tenant
        return OTHER

    def rerank(self, cap: int, declared: Iterable[str] = ()) -> list[str]:
        """Keep the declared tenants, then the busiest, `cap` in all; halve the counts and
        prune the table. Returns the tenants that lost their series (whose series
        `on_evict` removes)."""
        self._cap, self._table_max = cap, TABLE_FACTOR * cap
        preferred = frozenset(declared)
        counts = self._counts
        before = self._kept
        # A tenant seen once (a one-off subject of a flood) competes for no place: under a
        # flood the places would otherwise go round the last minute's one-offs.
        candidates = before | preferred | {t for t, n in counts.items() if n >= 2.0}
        if len(candidates) <= cap:
            self._kept = set(candidates)  # room for all: declared ones hold theirs in advance
        else:

            def rank(tenant: str) -> tuple[bool, float, bool, str]:
                held = tenant in before
                score = counts.get(tenant, 0.0) * (INCUMBENT_WEIGHT if held else 1.0)
                return (tenant in preferred, score, held, tenant)

            # Declared tenants first (by traffic, should there be more than the cap), then
            # the rest; incumbents win ties, so a quiet fleet keeps what it has.
            self._kept = set(sorted(candidates, key=rank, reverse=True)[:cap])
        evicted = sorted(before - self._kept)
        # Halve, and keep the busiest PRUNED_FACTOR x cap so newcomers find room.
        halved = {t: n / 2 for t, n in counts.items() if n >= 1.0}
        if len(halved) > PRUNED_FACTOR * cap:
            busiest = sorted(halved, key=halved.__getitem__, reverse=True)[: PRUNED_FACTOR * cap]
            halved = {t: halved[t] for t in busiest}
        self._counts = halved
        self._may_purge = True
        if evicted:
            for forget in self.on_evict:
                forget(evicted)
        return evicted
