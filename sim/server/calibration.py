"""Fit the latency model from measured time-to-first-token samples. Pure arithmetic.

What lives here: `fit_latency` (samples of (prompt tokens, TTFT) on an otherwise idle
endpoint, the network round trip, the policy's context buckets -> `LatencyFit`: base
latency, prefill ms per 1k tokens in the first bucket, and each bucket's slope relative to
it, the shape `sim.server.model.LatencyConfig` and the policy's `latency_model` section use) and
`pool_spread` (how far pools' fits lie apart; the field flags more than 15%).

The method is the field's: tiny requests at empty load give the base latency once the
network round trip is taken off; larger prompts then give the prefill cost per 1k tokens,
bucket by bucket. Means, not medians, because the model's parameters are means (its
lognormal jitter has mean 1, so a median would read long contexts ~10% low).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from policy.domain import ContextBucket, LatencyFit
from sim.server.model import ContextBucketProfile, LatencyConfig


@dataclass(frozen=True, slots=True)
class Sample:
    prompt_tokens: int
    ttft_ms: float  # as measured by the client, network included


def fit_latency(
    tiny: Sequence[Sample],
    probes: Sequence[Sample],
    rtt_ms: float,
    buckets: Sequence[ContextBucket],
) -> LatencyFit:
    """Base = mean tiny TTFT - RTT; per bucket, the mean of (TTFT - RTT - base) per 1k
    prompt tokens over its probes; slopes relative to the first bucket that has probes."""
    if not tiny:
        raise ValueError("need tiny requests for the base latency")
    base_ms = max(0.0, float(np.mean([s.ttft_ms for s in tiny])) - rtt_ms)
    per_bucket: dict[str, float] = {}
    for bucket in buckets:
        rates = [
            (s.ttft_ms - rtt_ms - base_ms) / (s.prompt_tokens / 1000.0)
            for s in probes
            if bucket.contains(s.prompt_tokens) and s.prompt_tokens > 0
        ]
        if rates:
            per_bucket[bucket.name] = max(0.0, float(np.mean(rates)))
    if not per_bucket:
        raise ValueError("no probe landed in any context bucket")
    first = next(iter(per_bucket.values()))
    slopes = {name: (rate / first if first > 0 else 1.0) for name, rate in per_bucket.items()}
    return LatencyFit(
        base_latency_ms=round(base_ms, 2),
        prefill_ms_per_1k_tokens=round(first, 3),
        bucket_slopes={name: round(slope, 3) for name, slope in slopes.items()},
    )


def pool_spread(fits: Mapping[str, LatencyFit]) -> dict[str, float]:
    """Per parameter, (max - min) / min across pools: 0.2 means one pool is 20% slower."""

    def spread(values: list[float]) -> float:
        low = min(values)
        return (max(values) - low) / low if low > 0 else 0.0

    if len(fits) < 2:
        return {}
    result = {
        "base_latency_ms": spread([f.base_latency_ms for f in fits.values()]),
        "prefill_ms_per_1k_tokens": spread([f.prefill_ms_per_1k_tokens for f in fits.values()]),
    }
    return {name: round(value, 4) for name, value in result.items()}


def latency_config(fit: LatencyFit, buckets: Sequence[ContextBucket]) -> LatencyConfig:
    """The simulator's latency model from a fit: the policy's buckets become the model's,
    with the measured slopes (a bucket without probes keeps the slope below it) and the
    policy's KV weights."""
    profiles = []
    slope = 1.0
    upper = 0
    for bucket in buckets:
        slope = fit.bucket_slopes.get(bucket.name, slope)
        upper = bucket.max_tokens if bucket.max_tokens is not None else max(2 * upper, 1)
        profiles.append(ContextBucketProfile(upper, slope, bucket.kv_weight))
    return LatencyConfig(
        base_latency_ms=fit.base_latency_ms,
        prefill_ms_per_1k_tokens=fit.prefill_ms_per_1k_tokens,
        buckets=tuple(profiles),
    )
