"""What the offline fleet (sim.fleet.offline) reports and is told: one request's fate, the fleet
sampled over time, an engine's outage."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.fleet.arrivals import Arrival

RETRIED_STATUSES = frozenset({429, 503})  # what an OpenAI SDK retries after Retry-After


@dataclass(slots=True)
class Served:
    """What became of one request."""

    arrival: Arrival
    pool: str
    # served, budget, shed, kv_full, queue_full, queue_timeout, engine_full, oom
    outcome: str
    ttft_s: float | None = None  # first arrival to first token: retries and waits included
    done_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0  # of its prompt, found in its engine's prefix cache
    waited_s: float = 0.0  # in the sidecar's waiting room, on the attempt that got through
    attempts: int = 1  # the client's tries (it retries after Retry-After)
    reason: str = ""  # a refusal's reason (x-slogate-reason); "" when admitted


@dataclass(frozen=True, slots=True)
class EngineOutage:
    """One engine of a pool down from `at_s` (its requests lost) until `until_s` (back
    empty: no cache, nothing running)."""

    pool: str
    index: int
    at_s: float
    until_s: float = math.inf


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet once per breaker evaluation, for plots: per pool KV usage, queue, level."""

    at_s: float
    kv_usage: dict[str, float]
    waiting: dict[str, int]
    levels: dict[str, int]
    multipliers: dict[str, float]
    score: float | None
