"""Configuration of one simulated pool: a frozen dataclass validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.server.model import LatencyConfig


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool ("default", "long", "fallback") of the simulated fleet.

    `time_scale` multiplies every simulated sleep (0.01 runs 100x faster; 0 never sleeps).
    Fault `latency_ms` is real time and is not scaled. `base_latency_ms` is the one knob for
    base latency: it overrides `latency.base_latency_ms` when the full shape is given.
    """

    name: str = "default"
    model: str = "deepseek-v4"
    time_scale: float = 1.0
    # Weighted tokens (context x bucket KV factor); a 128k request takes ~60% of the default.
    kv_capacity_tokens: int = 1_048_576
    max_running_requests: int = 256
    max_queue: int = 256
    max_model_len_tokens: int = 131_072
    seed: int = 0
    base_latency_ms: float = 150.0
    # > 1 admits past real capacity; such admissions fail (500) with overcommit_error_rate.
    kv_overcommit_ratio: float = 1.0
    overcommit_error_rate: float = 0.5
    prefix_cache_entries: int = 50_000
    latency: LatencyConfig | None = None
    # How prompts are counted: "approx" (a quarter of the UTF-8 bytes, free) or "deepseek"
    # (the real vocabulary, as vLLM counts: text built to fool an estimate costs its real size).
    tokenizer: str = "approx"
    # vLLM's --scheduling-policy: "fcfs" accepts an integer priority and ignores it (as
    # vLLM 0.32 does); "priority" queues by it, lower first.
    scheduling_policy: str = "fcfs"
    # vLLM's --served-model-name: another model is a 404. Empty: any model is served.
    served_models: tuple[str, ...] = ()
    # vLLM's prefix caching in the KV cache, in blocks of this many tokens (sim.server.
    # paged_kv; chats tokenized as the engine would: needs tokenizer "deepseek"). None: the
    # weighted-token KV cache beside an LRU of message prefixes.
    kv_block_size: int | None = None
    # Publish the paged cache's KV events on ZMQ (vLLM's --kv-events-config): the PUB port,
    # and the ROUTER replay port (None: no replay); 0 picks a free one. None: no events.
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise ValueError("pool name and model must be non-empty")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if self.kv_capacity_tokens <= 0 or self.max_running_requests <= 0:
            raise ValueError("kv_capacity_tokens and max_running_requests must be > 0")
        if self.max_queue < 0 or self.max_model_len_tokens <= 0:
            raise ValueError("max_queue must be >= 0 and max_model_len_tokens > 0")
        if not 0.0 <= self.overcommit_error_rate <= 1.0:
            raise ValueError("overcommit_error_rate must be within 0..1")
        if self.tokenizer not in ("approx", "deepseek"):
            raise ValueError("tokenizer must be 'approx' or 'deepseek'")
        if self.kv_overcommit_ratio < 1.0:
            raise ValueError("kv_overcommit_ratio must be >= 1")
        if self.kv_block_size is not None and (
            self.kv_block_size <= 0 or self.tokenizer != "deepseek"
        ):
            raise ValueError("kv_block_size must be > 0 and needs tokenizer 'deepseek'")
        if self.kv_events_port is not None and self.kv_block_size is None:
            raise ValueError("kv_events_port needs kv_block_size (a paged KV cache)")
        self.latency_config()  # validates base_latency_ms against the shape

    def latency_config(self) -> LatencyConfig:
        shape = self.latency or LatencyConfig()
        return dataclasses.replace(shape, base_latency_ms=self.base_latency_ms)
