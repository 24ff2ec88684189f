"""What this replica saw of each global tenant since its last flush: demand and usage.

What lives here: `RegionDemand` (pure, no I/O, no clock), which the budget step feeds as
it reserves, refuses and settles the requests of tenants whose scope is global, and which
the region agent (extproc.runtime.region_agent) empties each report interval into the
region's store, where every replica's part adds up to the region's. `Flushed` is one
tenant's part.

- demand: weighted tokens reserved plus weighted tokens refused. A refused request counts:
  a region held back for want of share still shows the global ledger what it wants, so
  its share can grow (the ledger divides by demand).
- usage: weighted tokens settled. The region store adds each flush to a cumulative total
  (never reset), which is what the region reports: a report repeated or lost changes
  nothing at the global ledger, which stores the total instead of adding it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Flushed:
    demand: float = 0.0  # weighted tokens reserved + refused since the last flush
    usage: float = 0.0  # weighted tokens settled since the last flush


class RegionDemand:
    def __init__(self) -> None:
        self._tenants: dict[str, Flushed] = {}
        # The tenants whose demand was counted: a settlement counts for these alone (the
        # settling step knows the request, not the tenant's scope when it was admitted).
        self._global: set[str] = set()

    def _of(self, tenant: str) -> Flushed:
        part = self._tenants.get(tenant)
        if part is None:
            part = self._tenants[tenant] = Flushed()
        return part

    def asked(self, tenant: str, weighted_tokens: float) -> None:
        """A request reserved, or was refused, `weighted_tokens`: the tenant's demand."""
        self._global.add(tenant)
        self._of(tenant).demand += weighted_tokens

    def settled(self, tenant: str, weighted_tokens: float) -> None:
        """A request of the tenant settled what it used (ignored for a tenant never asked
        for here: not a global one)."""
        if tenant in self._global:
            self._of(tenant).usage += weighted_tokens

    def take(self) -> dict[str, Flushed]:
        """Every tenant's part since the last take; empties it (the caller adds it up)."""
        taken, self._tenants = self._tenants, {}
        return taken

    def give_back(self, taken: dict[str, Flushed]) -> None:
        """A flush that did not reach the store: its parts wait for the next one (usage is
        a total the region reports, so none of it may be lost)."""
        for tenant, part in taken.items():
            own = self._of(tenant)
            own.demand += part.demand
            own.usage += part.usage
