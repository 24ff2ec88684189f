"""One engine and its state: serving, draining or dead. Pure.

What lives here: `Engine` (one vLLM / SGLang server: its address, health counters, what it
reported, what this sidecar holds on it), its `EngineState` as of a given time,
`engine_address` (its name everywhere) and `HeldOn` (what one request holds on it). An
engine is plain data and changes only through the fleet (engines.state.EngineFleet), which
keeps every pool's engines and decides when one goes out and comes back; the pool's view
of them is engines.pool_view. Apart so that both read one engine without importing the fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from breaker.engine import EngineSnapshot


class EngineState(StrEnum):
    SERVING = "serving"
    DRAINING = "draining"
    DEAD = "dead"


def engine_address(host: str, port: int) -> str:
    """The engine's name everywhere: Envoy's host address (`ip:port`, `[ipv6]:port`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class Engine:
    pool: str
    host: str
    port: int
    slot: int  # its bit in the pool's prefix index: never reused by another engine
    probes_failed: int = 0  # in a row
    probes_answered: int = 0  # in a row
    probe_dead: bool = False
    errors_in_row: int = 0
    ejected_until_s: float = -math.inf
    ejections_in_row: int = 0
    draining: bool = False
    snapshot: EngineSnapshot | None = None
    snapshot_at_s: float = -math.inf
    held_tokens: int = 0  # KV tokens of the requests this sidecar sent it that still run
    held_sequences: int = 0
    picked: int = 0  # requests slogate sent it
    answered: int = 0  # answers seen from it (access log)
    failed: int = 0  # of those, 5xx or failed connections
    dead_reason: str = ""
    returned_at_s: float = -math.inf  # when its probes last brought it back
    # Times it came back after its probes failed: its prefix cache is empty again.
    returns: int = 0
    # Its name (`engine_address`), made once: every pick reads it for every candidate.
    address: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.address = engine_address(self.host, self.port)

    def state(self, now_s: float) -> EngineState:
        if self.probe_dead or now_s < self.ejected_until_s:
            return EngineState.DEAD
        if self.draining:
            return EngineState.DRAINING
        return EngineState.SERVING

    def fresh(self, now_s: float, stale_after_s: float) -> EngineSnapshot | None:
        """Its latest metrics, None when older than `stale_after_s` (or never read)."""
        return self.snapshot if now_s - self.snapshot_at_s <= stale_after_s else None


class HeldOn(NamedTuple):  # a tuple: one per request, made cheaply
    """What one request holds on the engine it was sent to."""

    pool: str
    address: str
    tokens: int
    sequences: int
