"""Spend settlements the store could not take yet, retried until it answers.

What lives here: `SpendBacklog`, the settlements (and refunds) of spend reservations that
failed because the spend store (Redis) was slow or away, kept in order and retried by
`drain` on the sidecar's periodic loop, so that a request's spend is counted once the store
answers again instead of being left to expire at its reserved amount, and a reservation
that lands late after its request was refused is refunded. Every entry is safe to retry: a
plain settlement changes nothing the second time, an unverified one leaves a marker
(budget.spend.settle_unverified).

Bounds: an entry is tried until `deadline_s` (the caller's: within the reservation's ttl,
while a marker it leaves still stands), and at most `capacity` entries wait, the oldest
given up first; each one given up is counted (`lost`). A process that dies loses its
backlog: its reservations expire held, as any reservation never settled does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from budget.spend import SpendHold
from budget.spend_store import SpendStore
from budget.store import BudgetStoreError

log = logging.getLogger("slogate.spend")

# ~200 bytes an entry: 100,000 waiting settlements are ~20 MB, minutes of a busy fleet.
BACKLOG_CAPACITY = 100_000


@dataclass(frozen=True, slots=True)
class PendingSettlement:
    hold: SpendHold
    reservation_id: str
    actual: float | None  # what it spent; None: refund it all
    deadline_s: float  # given up past this (the caller's clock)
    ttl_s: float  # how long an unverified settlement's marker stays


@dataclass(frozen=True, slots=True)
class Drained:
    settled: int = 0  # taken by the store
    lost: int = 0  # given up: past their deadline, or over capacity since the last drain
    waiting: int = 0  # still waiting (the store failed again)


class SpendBacklog:
    def __init__(self, capacity: int = BACKLOG_CAPACITY) -> None:
        self._entries: deque[PendingSettlement] = deque()
        self._capacity = capacity
        self._dropped = 0  # given up over capacity since the last drain

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[PendingSettlement]:
        return iter(tuple(self._entries))

    def add(self, entry: PendingSettlement) -> None:
        if len(self._entries) >= self._capacity:
            self._entries.popleft()
            self._dropped += 1
        self._entries.append(entry)

    async def drain(self, store: SpendStore, now_s: float) -> Drained:
        """Retry the entries in order; stop at the first the store fails (it is still away:
        the rest would fail too, each after its timeout)."""
        settled, lost, self._dropped = 0, self._dropped, 0
        while self._entries:
            entry = self._entries[0]
            if entry.deadline_s <= now_s:
                self._entries.popleft()
                lost += 1
                log.warning(
                    "gave up settling %s's spend: the store did not answer in time",
                    entry.reservation_id,
                )
                continue
            try:
                await settle(store, entry.hold, entry.reservation_id, entry.actual, entry.ttl_s)
            except BudgetStoreError:
                break
            self._entries.popleft()
            settled += 1
        return Drained(settled, lost, len(self._entries))


async def settle(
    store: SpendStore,
    hold: SpendHold,
    reservation_id: str,
    actual: float | None,
    ttl_s: float,
) -> dict[str, float] | None:
    """One settlement as the store takes it: unverified when its reservation is unknown
    (leaving its marker `ttl_s`)."""
    if hold.verified:
        return await store.settle(hold.tenant, hold.window_ids, reservation_id, actual)
    return await store.settle_unverified(hold, reservation_id, actual, ttl_s)
