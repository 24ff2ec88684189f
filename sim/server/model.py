"""Latency and KV-cache model of one simulated inference pool.

Pure arithmetic over an injected `numpy.random.Generator`: no I/O, no clocks, no asyncio. The
aiohttp pool (`sim.server.pool`) and an offline discrete-event simulator (virtual clock) both drive
these objects, so anything that sleeps, reads the time or touches the network must stay out.

The numbers come from the field (see DESIGN.md, "Numbers from the field"):
- base latency for a tiny request on an empty engine ~150 ms (FP16 120-180 ms);
- per-token prefill cost by context bucket 1.0x / 1.3x / 1.8x (0-4k / 4-8k / 8-32k), larger
  beyond 32k; KV memory per token 1x / 1.8x / 4.2x (and ~15% more for long sessions);
- the tail is superlinear: lognormal jitter whose sigma grows with context, so that at 32k the
  P99 is ~3x the mean while short requests stay tight;
- decode time per output token grows with the number of running requests (batch size).
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# z-score of the 99th percentile of a standard normal.
_Z_P99 = 2.3263478740408408


@dataclass(frozen=True, slots=True)
class ContextBucketProfile:
    """Cost multipliers for requests whose token count is at most `upper_tokens`."""

    upper_tokens: int
    prefill_slope: float
    kv_factor: float


DEFAULT_BUCKETS: tuple[ContextBucketProfile, ...] = (
    ContextBucketProfile(upper_tokens=4_096, prefill_slope=1.0, kv_factor=1.0),
    ContextBucketProfile(upper_tokens=8_192, prefill_slope=1.3, kv_factor=1.8),
    ContextBucketProfile(upper_tokens=32_768, prefill_slope=1.8, kv_factor=4.2),
    # Field: "8k->32k P99 grows 2.3x, not 1.8x" and long sessions need ~15% more memory.
    ContextBucketProfile(upper_tokens=131_072, prefill_slope=2.3, kv_factor=4.2 * 1.15),
)


def bucket_for(tokens: int, buckets: Sequence[ContextBucketProfile]) -> ContextBucketProfile:
    """The first bucket whose upper bound holds `tokens`; the last one beyond all bounds."""
    for bucket in buckets:
        if tokens <= bucket.upper_tokens:
            return bucket
    return buckets[-1]


def lognormal_sigma_for_p99_over_mean(ratio: float) -> float:
    """Sigma of a mean-1 lognormal whose P99 is `ratio` times its mean.

    For X = exp(sigma*Z - sigma^2/2): P99/mean = exp(z99*sigma - sigma^2/2); take the smaller root.
    """
    if ratio < 1.0:
        raise ValueError(f"P99/mean ratio must be >= 1, got {ratio}")
    disc = _Z_P99 * _Z_P99 - 2.0 * math.log(ratio)
    if disc < 0.0:
        raise ValueError(f"P99/mean ratio {ratio} is beyond what a lognormal can reach")
    return _Z_P99 - math.sqrt(disc)


@dataclass(frozen=True, slots=True)
class LatencyConfig:
    """Shape of the latency model. Times are simulated (before any time scaling)."""

    base_latency_ms: float = 150.0
    prefill_ms_per_1k_tokens: float = 30.0
    buckets: tuple[ContextBucketProfile, ...] = DEFAULT_BUCKETS
    # TTFT interference from decode work sharing the batch (chunked prefill), per running request.
    ttft_batch_slope: float = 0.01
    # Tail: P99/mean of TTFT at <=1k tokens and at 32k; sigma interpolates in log2(tokens).
    p99_over_mean_at_1k: float = 1.4
    p99_over_mean_at_32k: float = 3.0
    max_tail_sigma: float = 1.2
    decode_ms_per_token: float = 20.0
    decode_batch_slope: float = 0.01
    decode_context_slope_per_1k: float = 0.005
    decode_sigma: float = 0.1
    output_tokens_mean: float = 200.0
    output_tokens_sigma: float = 0.8

    def __post_init__(self) -> None:
        if not self.buckets:
            raise ValueError("latency model needs at least one context bucket")
        bounds = [b.upper_tokens for b in self.buckets]
        if bounds != sorted(bounds):
            raise ValueError("context buckets must be ordered by upper_tokens")
        if self.base_latency_ms < 0 or self.prefill_ms_per_1k_tokens < 0:
            raise ValueError("latencies must be >= 0")
        if not 1.0 <= self.p99_over_mean_at_1k <= self.p99_over_mean_at_32k:
            raise ValueError("need 1 <= p99_over_mean_at_1k <= p99_over_mean_at_32k")
        if self.output_tokens_mean < 1:
            raise ValueError("output_tokens_mean must be >= 1")


@dataclass(slots=True)
class LatencyModel:
    """Samples TTFT, per-token decode time and output length for one request."""

    config: LatencyConfig
    rng: np.random.Generator
    _sigma_1k: float = field(init=False)
    _sigma_32k: float = field(init=False)

    def __post_init__(self) -> None:
        self._sigma_1k = lognormal_sigma_for_p99_over_mean(self.config.p99_over_mean_at_1k)
        self._sigma_32k = lognormal_sigma_for_p99_over_mean(self.config.p99_over_mean_at_32k)

    def tail_sigma(self, prompt_tokens: int) -> float:
        """Lognormal sigma of the TTFT jitter; grows linearly in log2(tokens) from 1k to 32k."""
        octaves = math.log2(max(prompt_tokens, 1_024) / 1_024)
        per_octave = (self._sigma_32k - self._sigma_1k) / 5.0  # 1k -> 32k is five doublings
        return min(self._sigma_1k + per_octave * octaves, self.config.max_tail_sigma)

    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """The prompt's prefill alone: its tokens not cached, at its bucket's slope."""
        cfg = self.config
        slope = bucket_for(prompt_tokens, cfg.buckets).prefill_slope
        prefill_tokens = max(prompt_tokens - cached_tokens, 0)
        return prefill_tokens / 1_000 * cfg.prefill_ms_per_1k_tokens * slope / 1_000

    def mean_ttft_s(self, prompt_tokens: int, running: int, cached_tokens: int = 0) -> float:
        """Expected TTFT; prefix-cache hits skip prefill but not the bucket's slope."""
        cfg = self.config
        prefill_ms = self.prefill_s(prompt_tokens, cached_tokens) * 1_000
        batch_factor = 1.0 + cfg.ttft_batch_slope * max(running, 0)
        return (cfg.base_latency_ms + prefill_ms) * batch_factor / 1_000

    def sample_ttft_s(self, prompt_tokens: int, running: int, cached_tokens: int = 0) -> float:
        """One TTFT draw: the mean times a mean-1 lognormal whose tail widens with context."""
        sigma = self.tail_sigma(prompt_tokens)
        jitter = math.exp(sigma * float(self.rng.standard_normal()) - sigma * sigma / 2)
        return self.mean_ttft_s(prompt_tokens, running, cached_tokens) * jitter

    def sample_decode_s_per_token(self, running: int, context_tokens: int = 0) -> float:
        """Inter-token time for one request; bigger batches and longer KV slow every step."""
        cfg = self.config
        batch_factor = 1.0 + cfg.decode_batch_slope * max(running, 0)
        context_factor = 1.0 + cfg.decode_context_slope_per_1k * max(context_tokens, 0) / 1_000
        sigma = cfg.decode_sigma
        jitter = math.exp(sigma * float(self.rng.standard_normal()) - sigma * sigma / 2)
        return cfg.decode_ms_per_token * batch_factor * context_factor * jitter / 1_000

    def sample_output_tokens(self, max_tokens: int) -> int:
        """Length the model 'wants' to write, capped by the request's max_tokens."""
        cfg = self.config
        sigma = cfg.output_tokens_sigma
        mu = math.log(cfg.output_tokens_mean) - sigma * sigma / 2
        wanted = round(float(self.rng.lognormal(mu, sigma)))
        return max(1, min(wanted, max_tokens))


def kv_tokens_for(
    prompt_tokens: int, max_tokens: int, buckets: Sequence[ContextBucketProfile]
) -> int:
    """KV-cache cost of a request: its whole context weighted by the bucket's KV factor."""
    context_tokens = prompt_tokens + max_tokens
    return math.ceil(context_tokens * bucket_for(context_tokens, buckets).kv_factor)


class EngineAdmission(enum.Enum):
    ADMITTED = "admitted"
    QUEUED = "queued"
    REJECTED_QUEUE_FULL = "rejected_queue_full"
    REJECTED_TOO_LARGE = "rejected_too_large"


class KvCache:
    """KV-cache capacity, running set and the waiting queue of one engine.

    A request holds its weighted context (`kv_tokens_for`) from admission to release. While
    anyone waits, newcomers queue behind them even if they would fit, as vLLM's scheduler
    does; the queue is FIFO, or, with vLLM's priority scheduling, ordered by each request's
    `priority` (lower first, FIFO within one). Running requests are never preempted here
    (vLLM may preempt for priority; not modelled). `overcommit_ratio` > 1 lets the engine
    admit past its real capacity; the pool turns work admitted into that region into
    OOM-like 500s.
    """

    def __init__(
        self,
        capacity_tokens: int,
        *,
        max_running: int = 256,
        max_queue: int = 256,
        overcommit_ratio: float = 1.0,
    ) -> None:
        if capacity_tokens <= 0 or max_running <= 0 or max_queue < 0:
            raise ValueError("capacity_tokens and max_running must be > 0, max_queue >= 0")
        if overcommit_ratio < 1.0:
            raise ValueError("overcommit_ratio must be >= 1")
        self.capacity_tokens = capacity_tokens
        self.max_running = max_running
        self.max_queue = max_queue
        self.overcommit_ratio = overcommit_ratio
        self.used_tokens = 0
        self._running: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._order: list[tuple[int, int, str]] = []  # (priority, arrival, id); lazily pruned
        self._arrivals = 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def usage_perc(self) -> float:
        """Fraction of real capacity in use, 0..1 like vLLM's gauge (overcommit reads as 1)."""
        return min(self.used_tokens / self.capacity_tokens, 1.0)

    @property
    def is_overcommitted(self) -> bool:
        return self.used_tokens > self.capacity_tokens

    def _fits(self, request_id: str, kv_tokens: int) -> bool:
        limit = self.capacity_tokens * self.overcommit_ratio
        return self.used_tokens + kv_tokens <= limit and len(self._running) < self.max_running

    def _too_large(self, request_id: str, kv_tokens: int) -> bool:
        return kv_tokens > self.capacity_tokens * self.overcommit_ratio

    def _take(self, request_id: str, kv_tokens: int) -> None:
        self._running[request_id] = kv_tokens
        self.used_tokens += kv_tokens

    def _give_back(self, request_id: str) -> None:
        self.used_tokens -= self._running.pop(request_id)

    def try_admit(self, request_id: str, kv_tokens: int) -> bool:
        """Admit now if nobody waits and the request fits; never queues."""
        if request_id in self._running or request_id in self._waiting:
            raise ValueError(f"request {request_id!r} is already known")
        if self._waiting or not self._fits(request_id, kv_tokens):
            return False
        self._take(request_id, kv_tokens)
        return True

    def submit(self, request_id: str, kv_tokens: int, priority: int = 0) -> EngineAdmission:
        """Admit, queue, or refuse a new request."""
        if self._too_large(request_id, kv_tokens):
            return EngineAdmission.REJECTED_TOO_LARGE  # would block the FIFO head forever
        if self.try_admit(request_id, kv_tokens):
            return EngineAdmission.ADMITTED
        if len(self._waiting) >= self.max_queue:
            return EngineAdmission.REJECTED_QUEUE_FULL
        self._waiting[request_id] = kv_tokens
        self._arrivals += 1
        heapq.heappush(self._order, (priority, self._arrivals, request_id))
        return EngineAdmission.QUEUED

    def release(self, request_id: str) -> list[str]:
        """Forget a running or waiting request; returns the waiting ids admitted as a result."""
        if request_id in self._running:
            self._give_back(request_id)
        else:
            self._waiting.pop(request_id, None)
        return self._admit_waiting()

    def _admit_waiting(self) -> list[str]:
        admitted: list[str] = []
        while self._order:
            head_id = self._order[0][2]
            if head_id not in self._waiting:  # released while it waited
                heapq.heappop(self._order)
                continue
            head_tokens = self._waiting[head_id]
            if not self._fits(head_id, head_tokens):
                break
            heapq.heappop(self._order)
            del self._waiting[head_id]
            self._take(head_id, head_tokens)
            admitted.append(head_id)
        return admitted


@dataclass(frozen=True, slots=True)
class PromptSegment:
    """A prefix-cacheable piece of a prompt: a chained content key and its token count."""

    key: bytes
    tokens: int


def chain_segments(pieces: Sequence[tuple[str, int]]) -> list[PromptSegment]:
    """Chain-hash prompt pieces so a segment's key identifies the whole prefix up to it."""
    segments: list[PromptSegment] = []
    key = b""
    for text, tokens in pieces:
        key = hashlib.blake2b(key + text.encode("utf-8"), digest_size=16).digest()
        segments.append(PromptSegment(key=key, tokens=tokens))
    return segments


class PrefixCache:
    """LRU set of prompt prefixes; a hit is the longest run of leading segments seen before."""

    def __init__(self, max_entries: int = 50_000) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be > 0")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, None] = OrderedDict()

    def lookup_and_insert(self, segments: Sequence[PromptSegment]) -> int:
        """Cached tokens for this prompt; records every segment as seen afterwards."""
        hit_tokens = 0
        still_hitting = True
        for segment in segments:
            if still_hitting and segment.key in self._entries:
                hit_tokens += segment.tokens
            else:
                still_hitting = False
            self._entries[segment.key] = None
            self._entries.move_to_end(segment.key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return hit_tokens
