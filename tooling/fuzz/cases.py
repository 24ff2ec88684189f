"""What the fuzz strategies draw and the campaign sends: one ext_proc stream (`StreamCase`)
or one access-log stream (`LogCase`), as the bytes of its messages."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamCase:
    """One ext_proc stream: its messages' bytes; `cancel_after`: the client resets the
    stream after that many replies (None: it half-closes and reads to the end)."""

    messages: tuple[bytes, ...]
    cancel_after: int | None
    origin: str  # "built" or "seed N mutated"


@dataclass(frozen=True, slots=True)
class LogCase:
    """One access-log stream: `routed` requests are decided first, and their ids replace
    the seeds' ROUTED_ID placeholders in the messages (those that still parse)."""

    messages: tuple[bytes, ...]
    routed: int
    origin: str
