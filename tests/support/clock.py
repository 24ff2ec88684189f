"""The one virtual clock of the tests: time moves only when a test moves it."""

from __future__ import annotations


class VirtualClock:
    def __init__(self, now_s: float = 1_000_000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
