"""A tenant-labelled metric whose tenant label is folded (extproc.service.tenant_series).

What lives here: `TenantFamily`, the way every capped tenant-labelled series is touched
(all of them but the spend series, whose tenants are the policy's few with a spend
budget): it asks the `TenantSeries` for the label, caches the child per label set (as
extproc.service.metrics.Family does, for the same ~2 us of prometheus_client's `labels()`),
and removes the children of the tenants a re-rank evicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from extproc.service.tenant_series import TenantSeries

M = TypeVar("M", Counter, Histogram, Gauge)


class TenantFamily(Generic[M]):
    """A metric whose first label is the tenant, folded by `series`. `counts`: each call is
    one request of the tenant's traffic (which decides who keeps a series): for one family
    touched once per request; the others place the tenant without counting."""

    def __init__(self, metric: M, series: TenantSeries, counts: bool = False) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}
        self._fold = series.label if counts else series.place
        series.on_evict.append(self.forget)

    def __call__(self, tenant: str, *labels: str) -> M:
        key = (self._fold(tenant), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.metric.labels(*key)
        return child

    def forget(self, tenants: Iterable[str]) -> None:
        """Remove the series of `tenants` (the exposition no longer shows them)."""
        gone = set(tenants)
        for key in [key for key in self._children if key[0] in gone]:
            del self._children[key]
            self.metric.remove(*key)
