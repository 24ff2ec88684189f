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

Held to a real vLLM 0.32 (tests/test_sim_matches_vllm.py): metric names, types and labels,
the JSON of answers and stream events (vLLM-only fields as null, `finish_reason` on the last
token's chunk, no `usage: null` chunks), vLLM's error documents (`type` from the status,
`code` the status; what the simulator meant rides in `x-sim-error`), FCFS ignoring an
integer `priority`, a 404 for a model it does not serve (with `--served-model-name`), and a
full KV cache queueing requests rather than failing them. Where it differs on purpose:
- speed: latencies come from the field's model (or a calibrated one) times `time_scale`;
- scale: its KV cache counts weighted tokens (the field's per-bucket KV factors) with no
  blocks (`cache_config_info` says block size 1), so it holds DeepSeek-sized contexts;
- it reserves a request's whole footprint (prompt + max_tokens) when it starts it, so it
  never preempts (`num_preemptions_total` stays 0) where vLLM grows requests block by block
  and preempts when the cache runs out; so it also queues sooner than vLLM does;
- it counts prompts with DeepSeek's vocabulary (`--tokenizer deepseek`) or a quarter of the
  bytes, where a vLLM counts with its model's tokenizer and chat template;
- its text is filler words; values vLLM fills in (`token_ids`, `system_fingerprint`) are
  null or fixed; it exports a subset of vLLM's metric families.
"""

from sim.config import PoolConfig
from sim.faults import Faults, FaultState
from sim.model import (
    DEFAULT_BUCKETS,
    ContextBucketProfile,
    EngineAdmission,
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
    "ContextBucketProfile",
    "EngineAdmission",
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
