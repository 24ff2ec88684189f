"""What admission reads of the regions: this region's share of each global tenant.

What lives here: `RegionShares`, the protocol the budget and spend steps read for a tenant
whose `scope` is `global` (the region agent, extproc.runtime.region_agent, answers it
from the lease it holds), `global_tenant`, which says whether a request's tenant is one,
and `PeerRooms`, what crossing reads of the other regions' pools (the agent answers it
too). A tenant whose scope is `region` (the default), and every tenant while the policy
has no `regions:` section, is admitted as before: its whole limits, in this region alone.
The design: docs/contributors/regions.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from budget.leases import PoolRoom
from policy.domain import BudgetScope
from policy.schema import Policy


class RegionShares(Protocol):
    def share(self, tenant: str) -> float | None:
        """The share of the tenant's global limits this region enforces now, in [0, 1];
        None: no lease applies (regions are off): the whole limits."""
        ...

    def spend_limit(self, tenant: str, window_id: str, limit: float) -> float | None:
        """The region's limit in one spend window ('day:2026-12-05') whose global limit is
        `limit`: what it has spent plus its share of what the world has left (as of its
        lease; 0 past it when the spend fallback is closed). None: the whole limit."""
        ...

    async def first_lease(self, tenant: str, wait_s: float) -> None:
        """Wait up to `wait_s` for a lease that names the tenant, when none does yet (a
        tenant new to this region: its demand reaches the ledger with the region's next
        report); at once when one does, or when no lease applies."""
        ...


class PeerRooms(Protocol):
    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        """The other live regions -> their pools' room (breaker level, waiting room full),
        as the global ledger last told this region; empty once that is stale (the region
        past its lease) or with one region: crossing reads it (admission.crossing)."""
        ...


def global_tenant(policy: Policy, tenant: str) -> bool:
    """The tenant has one budget worldwide, spent from this region's lease."""
    if not policy.regions.enabled:
        return False
    entry = policy.tenants.get(tenant)
    return entry is not None and entry.scope is BudgetScope.GLOBAL
