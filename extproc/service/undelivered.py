"""Replies grpc may not have handed to Envoy, settled by the access log's word on them.

A body reply whose ext_proc stream ended before grpc asked this servicer for more is
ambiguous: either Envoy had reset the stream first (the client left just as the waiting
room let its request in: no upstream request, and no access-log entry will name the
decision), or Envoy took the reply and closed the stream at once because the request was
already over (an engine's instant 404, a client gone right after its route was set). The
servicer cannot tell the two apart: the cancellation reaches grpc.aio's write either way.
Ending the request at once charged the second kind nothing and counted its real entry as
unmatched (CI saw it on a loaded machine: a fast vLLM error); waiting for the in-flight
expiry held the first kind's KV for minutes (bench/results/overhead-128k.md).

Envoy writes an entry for every request, so the entry decides, by the request's
x-request-id: one carrying the tracking id settles the request as usual; one without it
(the reply never applied its metadata) and without an upstream ends the decision with
nothing used. The entry may come first (it is batched, the decision may be a moment late):
the ids of such entries are remembered, a bounded number, so a later suspect ends at once.

Only suspects are ever ended this way, never a request whose reply grpc did take: a
client's own x-request-id (Envoy keeps it unless it is the edge) can at worst end a
suspect it names early, which is what every suspect cost before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

REMEMBERED_ENTRIES = 4096  # unrouted entries' ids kept for a suspect that comes later


class UndeliveredReplies(Generic[T]):
    """Suspects (request id -> tracking id, and how to end it) and the recent unrouted
    entries' ids."""

    def __init__(self, remembered: int = REMEMBERED_ENTRIES) -> None:
        self._suspects: dict[str, tuple[str, T]] = {}
        self._unrouted: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered

    def __len__(self) -> int:
        return len(self._suspects)

    def suspect(self, request_id: str, tracking: str, ending: T) -> bool:
        """Request `tracking`'s reply may not have reached Envoy. True: an entry without
        an upstream already named its request (end it now); False: kept until an entry
        comes (or the in-flight table expires it)."""
        if self._unrouted.pop(request_id, 0) is None:
            return True
        self._suspects[request_id] = (tracking, ending)
        return False

    def unrouted(self, request_id: str) -> tuple[str, T] | None:
        """An entry of request `request_id` that no reply of this sidecar reached and no
        upstream answered: the suspect it proves undelivered (its tracking id and ending),
        or None (remembered for a suspect that comes later)."""
        suspect = self._suspects.pop(request_id, None)
        if suspect is None:
            self._unrouted[request_id] = None
            self._unrouted.move_to_end(request_id)
            if len(self._unrouted) > self._remembered:
                self._unrouted.popitem(last=False)
        return suspect

    def delivered(self, request_id: str, tracking: str) -> None:
        """Request `tracking` was settled by its own entry: no longer a suspect."""
        suspect = self._suspects.get(request_id)
        if suspect is not None and suspect[0] == tracking:
            del self._suspects[request_id]

    def forget(self, in_flight: Callable[[str], bool]) -> None:
        """Drop the suspects no longer in flight (expired, or ended another way)."""
        gone = [rid for rid, (tracking, _) in self._suspects.items() if not in_flight(tracking)]
        for rid in gone:
            del self._suspects[rid]
