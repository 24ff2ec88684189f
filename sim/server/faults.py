"""Fault injection state of one simulated pool, with an injected clock.

`latency_ms` is REAL milliseconds added to every new request's TTFT: it is not multiplied by the
pool's `time_scale`, so a test running the pool at 0.01x can still inject a precise delay.
Faults are read once when a request arrives; requests already admitted never see a change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

ALLOWED_ERROR_STATUSES = frozenset({429, 500, 502, 503, 504})
_FIELDS = frozenset({"latency_ms", "error_rate", "error_status", "duration_s"})


@dataclass(frozen=True, slots=True)
class Faults:
    latency_ms: float = 0.0
    error_rate: float = 0.0
    error_status: int = 500

    @property
    def active(self) -> bool:
        return self.latency_ms > 0 or self.error_rate > 0


NO_FAULTS = Faults()


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'{key}' must be a number")
    return float(value)


def parse_fault_request(body: Any) -> tuple[Faults, float | None]:
    """Validate a POST /fault body; returns the faults and their optional duration in seconds.

    Strict like the policy loader: unknown keys are an error, not silently ignored.
    """
    if not isinstance(body, dict):
        raise ValueError("fault body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown fault keys: {', '.join(unknown)}")
    latency_ms = _number(body, "latency_ms", 0.0)
    error_rate = _number(body, "error_rate", 0.0)
    status = body.get("error_status", 500)
    if latency_ms < 0:
        raise ValueError("'latency_ms' must be >= 0")
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError("'error_rate' must be within 0..1")
    if isinstance(status, bool) or status not in ALLOWED_ERROR_STATUSES:
        raise ValueError(f"'error_status' must be one of {sorted(ALLOWED_ERROR_STATUSES)}")
    duration_s: float | None = None
    if body.get("duration_s") is not None:
        duration_s = _number(body, "duration_s", 0.0)
        if duration_s <= 0:
            raise ValueError("'duration_s' must be > 0")
    return Faults(latency_ms, error_rate, int(status)), duration_s


class FaultState:
    """Current faults; a POST replaces them all, an expired duration clears them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._faults = NO_FAULTS
        self._expires_at: float | None = None

    def set(self, faults: Faults, duration_s: float | None = None) -> None:
        self._faults = faults
        self._expires_at = None if duration_s is None else self._clock() + duration_s

    def clear(self) -> None:
        self.set(NO_FAULTS)

    def current(self) -> Faults:
        if self._expires_at is not None and self._clock() >= self._expires_at:
            self.clear()
        return self._faults

    def describe(self) -> dict[str, Any]:
        """JSON shape of GET /fault: the faults plus `remaining_s` (null when open-ended)."""
        faults = self.current()
        remaining_s = None
        if self._expires_at is not None:
            remaining_s = max(self._expires_at - self._clock(), 0.0)
        return {**asdict(faults), "remaining_s": remaining_s}
