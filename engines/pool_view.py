"""What every request reads of a pool: its engines, the serving ones and the sizes they add
up to, worked out once per change of the fleet. Pure.

What lives here: `PoolView` (one pool's engines and which of them serve, kept until
`EngineFleet.version` moves or the clock ends an ejection) and `PoolSizes` (what its serving
engines add up to under one pool spec, kept with the view). The fleet
(engines.state.EngineFleet) makes and keeps them; apart so that a reader of a view (the
picker) depends on what a view holds, not on how the fleet keeps its engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.engine import Engine
from policy.domain import Pool


@dataclass(slots=True)
class PoolSizes:
    """What a pool's serving engines add up to under one pool spec (`PoolView.sizes`)."""

    spec: Pool
    kv_tokens: tuple[float | None, ...]  # per serving engine, in `PoolView.serving`'s order
    largest_kv_tokens: float | None
    sequences: float | None  # each engine's batch slots
    # `EngineFleet.live_pool` while every engine serves (None: worked out on each call, for
    # a non-serving engine's held tokens move with every request).
    live: Pool | None


@dataclass(slots=True)
class PoolView:
    """One pool's engines and which of them serve, as every request reads them: made once
    per change of the fleet (`EngineFleet.version`) and kept until the clock reaches the
    next ejection's end, when an engine serves again without any call to say so. Never
    changed but for `sizes`, filled on first ask: a change makes a new view."""

    version: int
    made_s: float
    valid_until_s: float
    engines: tuple[Engine, ...]  # every known engine
    serving: tuple[Engine, ...]
    # The latest end of an ejection or return among the engines (`EngineFleet.out`).
    latest_out_s: float
    sizes: PoolSizes | None = None  # for the last spec asked about
