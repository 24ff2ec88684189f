"""The one virtual clock of the tests: the simulator's (sim.fleet.clock), started far from
zero so that no store mistakes a time for "never"."""

from __future__ import annotations

from sim.fleet import clock


class VirtualClock(clock.VirtualClock):
    def __init__(self, now_s: float = 1_000_000.0) -> None:
        super().__init__(now_s)
