"""Lending the KV reserve: a tier fills what the tiers above it leave unused.

KV admission (admission.kv.capacity) holds each tier to its share of a pool (by default
sheddable 0.85, standard 0.95, critical 1.0), so that a burst of the tiers above finds room.
Measured on burst-10x (seed 7, before lending): no critical or standard request waited for
that reserve outside the two bursts, yet it sat idle while batch work waited for it: the
engine ran at 0.83-0.85 of its cache for nine minutes (utilisation 0.77).

`KvLending` is one borrower's loan, per pool: the KV step (admission.kv.step) keeps one
for standard (out of critical's reserve) and one for sheddable (up to what standard may fill
now), both capped by the policy's `breaker.kv_lend_up_to`. What may live here: arithmetic
over what the caller passes in on each step (how long a request of a tier above waited for
room, the load score). No I/O and no clock; the KV step notes the waits and steps it every
controller interval, in the sidecar and in the simulator alike. While a request of a tier
above waits, the KV step lends nothing at all (its share is the policy's), so the loan never
takes room from a waiting request; the loan itself moves by AIMD, as the tier multipliers do
(budget.quotas):

- A request of a tier above that waited for room more than `patience` of the wait it may
  take (what its TTFT objective leaves; or one waiting that long now), a load score over
  `shrink_above`, or engines that report holding clearly more of their cache than the
  loan's ceiling (the ledger's footprint ratio counts short): the loan shrinks to
  `call_back` of itself (under one `grow_step`: to nothing). Multiplicative, not all at
  once: calling it all back at the first long wait left burst-10x's utilisation at
  0.81-0.82 (measured), and the room already serves the tiers above first.
- After `confirm` intervals in a row with nobody above kept waiting and the score under
  `grow_below`, the loan grows by `grow_step` of the pool per interval.
- Between the two (the score in the dead band): nothing moves. No score: hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from budget.quotas import Adjustment


@dataclass
class KvLending:
    borrower: str = "sheddable"  # the tier this loan is to (what its adjustments name)
    grow_step: float = 0.02  # of the pool's KV cache, per quiet interval
    confirm: int = 3  # quiet intervals in a row before the loan grows
    patience: float = 0.9  # of its longest wait: a wait above that calls the loan back
    call_back: float = 0.9  # what is left of the loan after a wait too long or an overload
    grow_below: float = 0.8  # the load score under which a calm counts (TierMultipliers')
    shrink_above: float = 1.0  # ... over which the loan is called back
    lent: dict[str, float] = field(default_factory=dict)  # pool -> share lent to the borrower
    _waited: dict[str, float] = field(default_factory=dict)  # pool -> the longest noted wait
    _quiet: dict[str, int] = field(default_factory=dict)

    def note_wait(self, pool: str, waited: float) -> None:
        """A request of a tier above waited for room in `pool` (admitted after it, or timed
        out): `waited`, the part of its longest wait it took (1.0: all of it)."""
        self._waited[pool] = max(waited, self._waited.get(pool, 0.0))

    def share(self, pool: str, base: float, most: float) -> float:
        """The borrower's share of `pool`: its policy share `base` plus the loan, never above
        `most` (the share it may borrow up to)."""
        return max(base, min(most, base + self.lent.get(pool, 0.0)))

    def step(
        self,
        pool: str,
        waiting: float,
        score: float | None,
        room: float,
        engine_over: bool = False,
    ) -> Adjustment | None:
        """One controller interval for `pool`: `waiting`, the largest part of its longest
        wait that a request of a tier above, waiting in it now, has waited (0: none waits);
        `score`, the load score (breaker.board.fleet_load); `room`, the most that may be
        lent (the ceiling less the policy share; <= 0: nothing); `engine_over`, the engines
        report holding clearly more of their cache than the loan's ceiling (the ledger
        counts short of what they hold)."""
        waited = max(waiting, self._waited.pop(pool, 0.0))
        room = round(room, 6)  # 0.95 - 0.85 is 0.0999...: no move for float dust
        before = self.lent.get(pool, 0.0)
        inputs = {
            "waited": waited,
            "score": score if score is not None else -1.0,
            "engine_over": float(engine_over),
        }
        overloaded = engine_over or (score is not None and score > self.shrink_above)
        if room <= 0 or waited > self.patience or overloaded:
            self._quiet[pool] = 0
            after = min(room, before * self.call_back) if room > 0 else 0.0
            return self._set(pool, before, after if after >= self.grow_step else 0.0, inputs)
        if score is None:
            return None  # no signal: neither lend more nor call back
        calm = score < self.grow_below
        self._quiet[pool] = self._quiet.get(pool, 0) + 1 if calm else 0
        after = min(before, room)  # a lowered ceiling (a reloaded policy) takes effect
        if calm and self._quiet[pool] >= self.confirm:
            after = min(room, before + self.grow_step)
        return self._set(pool, before, after, inputs)

    def _set(
        self, pool: str, before: float, after: float, inputs: dict[str, float]
    ) -> Adjustment | None:
        after = round(after, 6)  # steps of 0.02 add up without drifting past the ceiling
        if after == before:
            return None
        self.lent[pool] = after
        return Adjustment(f"kv_lend:{self.borrower}:{pool}", before, after, inputs)
