"""Simulated inference fleet: a stand-in for vLLM pools used by tests, the local stack and load
tests.

- `sim.model`   pure latency / KV-cache / prefix-cache model (seeded RNG, no I/O, no clock), shared
                with the offline discrete-event simulator.
- `sim.config`  `PoolConfig`, the frozen configuration of one pool.
- `sim.faults`  fault-injection state (extra latency, error rate) with an injected clock.
- `sim.metrics` vLLM-named Prometheus metrics in a per-pool registry.
- `sim.pool`    the aiohttp server of one pool (`create_app`) and its CLI, `python -m sim.pool`.

This package's top level re-exports only the pure parts, so an offline simulation can
`import sim` without pulling in aiohttp; import the server from `sim.pool`.
"""

from sim.config import PoolConfig
from sim.faults import Faults, FaultState
from sim.model import (
    DEFAULT_BUCKETS,
    Admission,
    ContextBucketProfile,
    KvCache,
    LatencyConfig,
    LatencyModel,
    PrefixCache,
    PromptSegment,
    bucket_for,
    chain_segments,
    kv_tokens_for,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "Admission",
    "ContextBucketProfile",
    "FaultState",
    "Faults",
    "KvCache",
    "LatencyConfig",
    "LatencyModel",
    "PoolConfig",
    "PrefixCache",
    "PromptSegment",
    "bucket_for",
    "chain_segments",
    "kv_tokens_for",
]
