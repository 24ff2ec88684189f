"""The share of a pool's KV each tier may fill now, for the KV step (admission.kv.step).

What lives here: `TierShares`: the policy's `breaker.kv_shares`, with for the tiers below
critical what is lent to them on top while nobody above waits for it (budget.lending:
this replica's own loans, from its own waiting room's waits; standard first, since what
it may fill bounds what sheddable may borrow), and over both the caps the quota
controller sets while it reserves headroom ahead of a ramp (budget.ahead; tier name ->
share, read at each admission). The reservation wins over the loan.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.kv.capacity import pool_capacity
from admission.waiting_room import WaitingRoom
from budget.lending import KvLending
from budget.quotas import Adjustment
from policy.domain import Tier
from policy.schema import Policy

# The tiers a borrower's loan is called back for, the nearest last.
_ABOVE = {Tier.STANDARD: (Tier.CRITICAL,), Tier.SHEDDABLE: (Tier.CRITICAL, Tier.STANDARD)}


class TierShares:
    def __init__(self, room: Callable[[], WaitingRoom], clock: Callable[[], float]) -> None:
        """`room`: the KV step's waiting room (whether a tier above waits, and how long)."""
        self._room = room
        self._clock = clock
        # Caps on a tier's share (tier name -> share) that the quota controller sets while
        # it reserves headroom ahead of a ramp (budget.ahead).
        self.caps: dict[str, float] = {}
        self.lending = {tier: KvLending(tier.value) for tier in (Tier.STANDARD, Tier.SHEDDABLE)}

    def share(self, policy: Policy, pool: str, tier: Tier) -> float:
        """The share of `pool` that `tier` may fill now: the policy's, and for a tier below
        critical what is lent to it on top (budget.lending), never past `kv_lend_up_to`
        nor, for sheddable, past what standard may fill now; and never past the cap the
        quota controller sets while it reserves headroom ahead of a ramp (budget.ahead):
        the reservation wins over the loan."""
        base = policy.breaker.kv_shares[tier]
        cap = self.caps.get(tier.value, 1.0)
        lending = self.lending.get(tier)
        if lending is None or self._room().ahead(pool, _ABOVE[tier][-1]):
            # While a tier above waits for room, nothing is lent: the room's backfill would
            # otherwise let the borrower take what frees before them.
            return min(base, cap)
        return min(cap, lending.share(pool, base, self._lend_ceiling(policy, pool, tier)))

    def _lend_ceiling(self, policy: Policy, pool: str, tier: Tier) -> float:
        above = _ABOVE[tier][-1]
        return min(policy.breaker.kv_lend_up_to, self.share(policy, pool, above))

    def step(
        self,
        policy: Policy,
        score: float | None,
        kv_cache_usage: Callable[[str], float | None] | None = None,
    ) -> list[Adjustment]:
        """One controller interval of the loans in every pool admitted against: standard's
        first (sheddable's ceiling is what standard may fill), each called back where a
        tier above it waited too long for room, or where the engines report holding more
        than the ceiling (`kv_cache_usage(pool)`, scraped; None: not known)."""
        now_s = self._clock()
        moved = []
        for tier, lending in self.lending.items():
            base = policy.breaker.kv_shares[tier]
            for name, spec in policy.pools.items():
                if pool_capacity(spec) is None:
                    continue
                # A cap the quota controller holds ahead of a ramp (budget.ahead) bounds the
                # loan too: under it the loan is called back at once instead of growing
                # unseen behind the cap and landing whole when the cap lifts (measured on the
                # sharp class start: burst handling 0.958 with the calendar, against 0.985
                # reacting only).
                ceiling = min(
                    self._lend_ceiling(policy, name, tier), self.caps.get(tier.value, 1.0)
                )
                waiting = self._room().longest_wait_share(name, now_s, _ABOVE[tier])
                usage = kv_cache_usage(name) if kv_cache_usage is not None else None
                # A quarter of the way from the ceiling to a full cache: the ledger counts
                # short. (Measured on generous-max-tokens, seed 7: at the ceiling itself no
                # OOM, but burst-10x's utilisation fell to 0.846; at a quarter one OOM, as
                # without the guard; calling the whole loan back there: 0.842.)
                over = usage is not None and usage > ceiling + (1.0 - ceiling) / 4
                adjustment = lending.step(name, waiting, score, ceiling - base, over)
                if adjustment is not None:
                    moved.append(adjustment)
        return moved

    def note_wait(self, pool: str, tier: Tier, waited: float) -> None:
        """A request of `tier` waited `waited` of what it may wait for room in `pool`: what
        the tiers below it borrowed there may be called back."""
        for borrower, lending in self.lending.items():
            if tier in _ABOVE[borrower]:
                lending.note_wait(pool, waited)
