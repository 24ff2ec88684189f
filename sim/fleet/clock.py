"""The virtual clock: time moves only when its owner moves it (the offline fleet, a test)."""

from __future__ import annotations


class VirtualClock:
    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
