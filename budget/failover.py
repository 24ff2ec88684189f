"""Redis trouble is not an outage: shared budgets when Redis answers, local shares when not.

What lives here: `FailoverStore`, a BudgetStore over a shared store (Redis) and a local
one (in-process), and `Outage`, when a failover tries its shared store (the KV ledger's,
admission.kv.book.FailoverBook, keeps one too). While the shared store fails or is slower
than its timeout, decisions are made locally against 1/replicas of every limit
(`replicas`: the live replicas' count from their heartbeats, admission.kv.redis_ledger),
so the replicas together stay near the shared limit. After `retry_interval_s` the next
decision tries the shared store again; once it answers, new reservations go there. Each
reservation is settled in the store that made it, so nothing made during the outage is lost
or settled twice.

What is not done: usage spent locally during an outage is not copied into Redis when it
returns (each side's buckets refill within a minute; hourly buckets may admit up to one
local share more in the hour of the outage).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from budget.ledger import Charge, Verdict, scale_limits
from budget.store import USAGE_WINDOWS_S, BudgetStore, BudgetStoreError
from policy.domain import Limits

log = logging.getLogger("slogate.budget")


class Outage:
    """Whether a failover takes its shared store (Redis) as answering: after a failure it
    decides locally, and tries the shared store again once `retry_interval_s` has passed.
    The first failure of an outage is logged to `log` as `what`."""

    def __init__(
        self, clock: Callable[[], float], retry_interval_s: float, log: logging.Logger, what: str
    ) -> None:
        self._clock = clock
        self._retry_interval_s = retry_interval_s
        self._log = log
        self._what = what
        self.up = True
        self._retry_at = -math.inf

    def failed(self, error: Exception) -> None:
        if self.up:
            self._log.warning("%s: %s", self._what, error)
        self.up = False
        self._retry_at = self._clock() + self._retry_interval_s

    def worth_trying(self) -> bool:
        """Up, or down long enough to try again."""
        return self.up or self._clock() >= self._retry_at


def local_share(limits: Limits, replicas: int) -> Limits:
    """Each replica's part of the limits when it must decide alone."""
    return scale_limits(limits, 1.0 / replicas) if replicas > 1 else limits


class FailoverStore:
    def __init__(
        self,
        shared: BudgetStore,
        local: BudgetStore,
        replicas: Callable[[], int],
        retry_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_decision: Callable[[bool], None] | None = None,  # called with degraded=True/False
    ) -> None:
        self._shared = shared
        self._local = local
        self._replicas = replicas
        self._on_decision = on_decision
        self._outage = Outage(
            clock, retry_interval_s, log, "budget store unavailable, deciding on local shares"
        )
        self._local_reservations: set[str] = set()
        # Reserves that failed or timed out may still have run in Redis; they are refunded
        # there once it answers again, so a timeout never leaves a phantom reservation.
        self._orphans: dict[str, tuple[str, Limits]] = {}

    @property
    def healthy(self) -> bool:
        return self._outage.up

    async def reserve(
        self, key_id: str, limits: Limits, charge: Charge, reservation_id: str, ttl_s: float
    ) -> Verdict:
        if self._outage.worth_trying():
            try:
                verdict = await self._shared.reserve(key_id, limits, charge, reservation_id, ttl_s)
            except BudgetStoreError as error:
                self._orphans[reservation_id] = (key_id, limits)
                self._outage.failed(error)
            else:
                if not self.healthy:
                    log.warning("budget store is back; shared budgets again")
                self._outage.up = True
                if self._orphans:
                    await self._refund_orphans()
                if self._on_decision:
                    self._on_decision(False)
                return verdict
        verdict = await self._local.reserve(
            key_id, local_share(limits, self._replicas()), charge, reservation_id, ttl_s
        )
        if verdict.admitted:
            self._local_reservations.add(reservation_id)
        if self._on_decision:
            self._on_decision(True)
        return verdict

    async def _refund_orphans(self) -> None:
        orphans, self._orphans = self._orphans, {}
        for reservation_id, (key_id, limits) in orphans.items():
            try:
                await self._shared.settle(key_id, limits, reservation_id, None)
            except BudgetStoreError:
                self._orphans[reservation_id] = (key_id, limits)  # next time, then

    async def settle(
        self, key_id: str, limits: Limits, reservation_id: str, actual: Charge | None
    ) -> bool:
        if reservation_id in self._local_reservations:
            self._local_reservations.discard(reservation_id)
            return await self._local.settle(
                key_id, local_share(limits, self._replicas()), reservation_id, actual
            )
        try:
            return await self._shared.settle(key_id, limits, reservation_id, actual)
        except BudgetStoreError as error:
            # The reservation stays in Redis and expires there: its slot frees, nothing leaks.
            self._outage.failed(error)
            return False

    async def usage(
        self, key_id: str, windows_s: Sequence[int] = USAGE_WINDOWS_S
    ) -> dict[int, float]:
        local = await self._local.usage(key_id, windows_s)
        try:
            shared = await self._shared.usage(key_id, windows_s)
        except BudgetStoreError:
            return local
        return {w: shared[w] + local[w] for w in windows_s}

    async def outstanding(self, key_id: str) -> int:
        local = await self._local.outstanding(key_id)
        try:
            return local + await self._shared.outstanding(key_id)
        except BudgetStoreError:
            return local

    async def close(self) -> None:
        await self._shared.close()
        await self._local.close()
