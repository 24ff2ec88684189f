"""A region's side of the lease: which share of each global tenant it enforces, and when.

What lives here: `LeaseHolder`, fed the region's reports as they leave (`sent`), their
answers (`received`) and their failures (`failed`), and asked for a tenant's share and a
spend window's allowance at a time the caller passes in. Pure: no I/O, no clock. The
arithmetic of the answer is budget.leases; the process that reports is the region agent.

A lease is measured from the moment its report was *sent*, so it ends no later than the
global ledger's hold for it (the ledger measures from when the report arrived). Per tenant:

- less than `lease_s`: the lease's share; spend up to the lease's ceiling;
- then for `fallback_for_s`: limits_fallback `share`: min(fallback_share, the lease's share)
  (fallback_share None: the lease's), `closed`: 0; spend_fallback `share`: the ceiling,
  `closed`: no more;
- later: 0, and no more spend.

"No more" is the region's own spend now (a window admits a request while spent + cost fits
its limit). `fallback_share` caps the fallback at the share held: a fixed share larger than
the region held could have been granted to the others meanwhile.

A tenant the region has no lease for (before the first answer, or a tenant new to the
policy) has share None and a spend allowance of nothing more: the caller enforces a share
of 0 (refuses it against its global budget) until a lease names it, one report's round
trip after start. Using `min_share` instead would be unbacked: the ledger may have given
the other regions everything.

One report in flight at a time: an answer is measured from the earliest send not yet
answered or failed, and a lease older (by seq) than the one held is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from budget.leases import Lease, LeaseSettings, TenantLease
from policy._regions import Fallback

STATES = ("leased", "cut_off", "fallback", "closed", "none")


@dataclass(frozen=True, slots=True)
class _Held:
    lease: TenantLease
    sent_s: float  # when the report this lease answered left
    lease_s: float


class LeaseHolder:
    def __init__(
        self, settings: LeaseSettings, limits_fallback: Fallback, spend_fallback: Fallback
    ) -> None:
        self._settings = settings
        self._limits_fallback = limits_fallback
        self._spend_fallback = spend_fallback
        self._pending_s: float | None = None  # the send awaiting its answer
        self._latest_sent_s: float | None = None  # the latest lease, region-wide
        self._latest_lease_s = 0.0
        self._seq = -1
        self._cut_off = False
        self._tenants: dict[str, _Held] = {}

    @property
    def seq(self) -> int:
        """The seq of the last lease received (-1: none); the next report uses seq + 1."""
        return self._seq

    def sent(self, now_s: float) -> None:
        """A report left now: its lease, if it comes, is measured from here."""
        if self._pending_s is None:
            self._pending_s = now_s

    def received(self, lease: Lease) -> None:
        """The answer to the report in flight."""
        sent_s = self._pending_s
        self._pending_s = None
        stale = lease.seq < self._seq
        self._seq = max(self._seq, lease.seq)
        if sent_s is None or lease.lease_s <= 0.0 or stale:
            return  # unsolicited, stale, or a report the ledger had seen: nothing granted
        self._cut_off = False
        self._latest_sent_s = sent_s
        self._latest_lease_s = lease.lease_s
        for tenant, line in lease.tenants.items():
            self._tenants[tenant] = _Held(line, sent_s, lease.lease_s)

    def failed(self, now_s: float) -> None:
        """The report in flight did not answer in time (its answer, if late, is dropped)."""
        del now_s  # the state follows from the lease's send time; kept for the call's shape
        self._pending_s = None
        self._cut_off = True

    def state(self, now_s: float) -> str:
        """ "leased" | "cut_off" (a report failed, the lease still good) | "fallback" |
        "closed" | "none" (no lease yet)."""
        if self._latest_sent_s is None:
            return "none"
        age = now_s - self._latest_sent_s
        if age < self._latest_lease_s:
            return "cut_off" if self._cut_off else "leased"
        if age < self._latest_lease_s + self._settings.fallback_for_s:
            return "fallback"
        return "closed"

    def expires_in_s(self, now_s: float) -> float:
        """Seconds until the latest lease ends (<= 0: ended; 0 with none)."""
        if self._latest_sent_s is None:
            return 0.0
        return self._latest_sent_s + self._latest_lease_s - now_s

    def share(self, tenant: str, now_s: float) -> float | None:
        """The share of `tenant`'s global limits to enforce now; None: no lease names it
        (enforce 0)."""
        held = self._tenants.get(tenant)
        if held is None:
            return None
        age = now_s - held.sent_s
        if age < held.lease_s:
            return held.lease.share
        if age < held.lease_s + self._settings.fallback_for_s:
            if self._limits_fallback is Fallback.CLOSED:
                return 0.0
            cap = self._settings.fallback_share
            return held.lease.share if cap is None else min(cap, held.lease.share)
        return 0.0

    def applied(self, tenant: str, now_s: float) -> float:
        """The share to report as enforced (TenantReport.applied)."""
        return self.share(tenant, now_s) or 0.0

    def spend_ceilings(self, tenant: str, now_s: float) -> Mapping[str, float]:
        """The spend ceilings to report as enforced (TenantReport.spend_applied): the
        lease's until the region admits nothing more against them."""
        held = self._tenants.get(tenant)
        if held is None or self._spend_closed(held, now_s):
            return {}
        return held.lease.spend_ceiling

    def spend_allowance(
        self, tenant: str, window_key: str, limit: float, own_spent_now: float, now_s: float
    ) -> float:
        """The region's limit for `tenant`'s spend in `window_key` (the window's global
        `limit`): the lease's ceiling (never above `limit`), or `own_spent_now` (nothing
        more) without a lease for the window or once the fallback closes it."""
        held = self._tenants.get(tenant)
        if held is None or self._spend_closed(held, now_s):
            return own_spent_now
        ceiling = held.lease.spend_ceiling.get(window_key)
        if ceiling is None:
            return own_spent_now
        return min(ceiling, limit)

    def ends_s(self, tenant: str) -> tuple[float, float] | None:
        """When `tenant`'s lease ends and when its fallback ends (None: no lease names it)."""
        held = self._tenants.get(tenant)
        if held is None:
            return None
        end = held.sent_s + held.lease_s
        return end, end + self._settings.fallback_for_s

    def global_lease(self, tenant: str) -> TenantLease | None:
        """The latest lease line for `tenant` (global usage and spend, for status)."""
        held = self._tenants.get(tenant)
        return None if held is None else held.lease

    def _spend_closed(self, held: _Held, now_s: float) -> bool:
        age = now_s - held.sent_s
        if age < held.lease_s:
            return False
        if age < held.lease_s + self._settings.fallback_for_s:
            return self._spend_fallback is Fallback.CLOSED
        return True
