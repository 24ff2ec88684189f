"""Requests the sidecar routed and whose access-log entry has not come back yet.

What lives here: `InFlight`, a table from a sidecar-issued id to the request's decision.
The id travels through Envoy as the only dynamic-metadata field the access log needs, so a
client-chosen `x-request-id` can never make two requests collide. Entries whose access-log
entry never arrives (Envoy restarted, the log was dropped) are expired by age, so the table
stays bounded and later budget code can refund them. Pure: the clock is injected.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    def __init__(self, clock: Callable[[], float], ttl_s: float, prefix: str | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._clock = clock
        self._ttl_s = ttl_s
        # Insertion order is admission order, so the oldest entries are always at the front.
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()
        # A per-process prefix keeps ids unique across replicas that share a budget store
        # (a worker's also says which worker decided: extproc.runtime.workers).
        self._prefix = prefix or os.urandom(4).hex()
        self._counter = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def new_id(self) -> str:
        return f"{self._prefix}-{next(self._counter):x}"

    def put(self, key: str, item: T) -> None:
        self._entries[key] = (self._clock(), item)

    def add(self, item: T) -> str:
        key = self.new_id()
        self.put(key, item)
        return key

    def pop(self, key: str) -> T | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def expire(self) -> list[tuple[str, T]]:
        """Remove and return (id, entry) for every entry older than the ttl."""
        oldest_kept = self._clock() - self._ttl_s
        expired: list[tuple[str, T]] = []
        while self._entries:
            key, (added_at, item) = next(iter(self._entries.items()))
            if added_at > oldest_kept:
                break
            del self._entries[key]
            expired.append((key, item))
        return expired
