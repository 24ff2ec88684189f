"""The pure latency / KV-cache model of the simulated fleet: no I/O, seeded, deterministic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sim.server.model import (
    DEFAULT_BUCKETS,
    EngineAdmission,
    KvCache,
    LatencyConfig,
    LatencyModel,
    PrefixCache,
    bucket_for,
    chain_segments,
    kv_tokens_for,
    lognormal_sigma_for_p99_over_mean,
)


def _model(seed: int = 0, **overrides: Any) -> LatencyModel:
    return LatencyModel(LatencyConfig(**overrides), np.random.default_rng(seed))


def _draws(model: LatencyModel, prompt_tokens: int, n: int) -> np.ndarray:
    return np.array([model.sample_ttft_s(prompt_tokens, 0) for _ in range(n)])


def test_same_seed_same_draws_different_seed_different_draws() -> None:
    def sequence(seed: int) -> list[float]:
        model = _model(seed)
        out: list[float] = []
        for _ in range(50):
            out.append(model.sample_ttft_s(3_000, 4))
            out.append(model.sample_decode_s_per_token(4, 3_256))
            out.append(float(model.sample_output_tokens(512)))
        return out

    assert sequence(7) == sequence(7)
    assert sequence(7) != sequence(8)


def test_bucket_boundaries_are_inclusive_and_last_bucket_catches_overflow() -> None:
    assert bucket_for(1, DEFAULT_BUCKETS).upper_tokens == 4_096
    assert bucket_for(4_096, DEFAULT_BUCKETS).upper_tokens == 4_096
    assert bucket_for(4_097, DEFAULT_BUCKETS).upper_tokens == 8_192
    assert bucket_for(32_768, DEFAULT_BUCKETS).upper_tokens == 32_768
    assert bucket_for(10**6, DEFAULT_BUCKETS).upper_tokens == 131_072


def test_field_numbers_for_slopes_and_kv_factors() -> None:
    slopes = [b.prefill_slope for b in DEFAULT_BUCKETS]
    kv_factors = [b.kv_factor for b in DEFAULT_BUCKETS]
    assert slopes[:3] == [1.0, 1.3, 1.8]
    assert kv_factors[:3] == [1.0, 1.8, 4.2]
    assert slopes == sorted(slopes) and slopes[3] > slopes[2]
    assert kv_factors == sorted(kv_factors)


def test_mean_prefill_cost_per_token_grows_by_bucket() -> None:
    model = _model(base_latency_ms=0.0)
    per_token = [model.mean_ttft_s(b.upper_tokens, 0) / b.upper_tokens for b in DEFAULT_BUCKETS]
    assert per_token == sorted(per_token)
    assert per_token[1] / per_token[0] == pytest.approx(1.3)
    assert per_token[2] / per_token[0] == pytest.approx(1.8)


def test_base_latency_for_a_tiny_request_on_an_empty_engine() -> None:
    assert 0.12 <= _model().mean_ttft_s(10, 0) <= 0.18
    samples = _draws(_model(), 10, 5_000)
    assert samples.mean() == pytest.approx(0.15, rel=0.05)


def test_p99_over_mean_at_32k_is_about_three_and_short_requests_are_tight() -> None:
    model = _model(seed=1)
    long = _draws(model, 32_768, 40_000)
    short = _draws(model, 500, 40_000)
    long_ratio = np.percentile(long, 99) / long.mean()
    short_ratio = np.percentile(short, 99) / short.mean()
    assert long_ratio == pytest.approx(3.0, rel=0.1)
    assert short_ratio == pytest.approx(1.4, rel=0.1)
    # Jitter has mean 1: the tail widens without moving the mean.
    assert long.mean() == pytest.approx(model.mean_ttft_s(32_768, 0), rel=0.05)


def test_tail_sigma_grows_with_context() -> None:
    model = _model()
    sigmas = [model.tail_sigma(t) for t in (500, 2_000, 8_000, 32_768, 131_072)]
    assert sigmas == sorted(sigmas)
    assert sigmas[0] < sigmas[-1] <= model.config.max_tail_sigma


def test_lognormal_sigma_solver_rejects_impossible_ratios() -> None:
    assert lognormal_sigma_for_p99_over_mean(1.0) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        lognormal_sigma_for_p99_over_mean(0.5)
    with pytest.raises(ValueError):
        lognormal_sigma_for_p99_over_mean(100.0)


def test_ttft_and_decode_grow_with_batch_and_context() -> None:
    model = _model()
    assert model.mean_ttft_s(2_000, 64) > model.mean_ttft_s(2_000, 0)
    quiet = np.mean([_model(s).sample_decode_s_per_token(0) for s in range(200)])
    busy = np.mean([_model(s).sample_decode_s_per_token(128) for s in range(200)])
    long_ctx = np.mean([_model(s).sample_decode_s_per_token(0, 100_000) for s in range(200)])
    assert quiet == pytest.approx(0.020, rel=0.05)
    assert busy > 2 * quiet
    assert long_ctx > 1.3 * quiet


def test_prefix_cache_hits_skip_prefill() -> None:
    model = _model()
    assert model.mean_ttft_s(8_000, 0, cached_tokens=7_000) < model.mean_ttft_s(8_000, 0) / 2


def test_output_tokens_stay_within_one_and_max_tokens() -> None:
    model = _model()
    lengths = [model.sample_output_tokens(64) for _ in range(2_000)]
    assert min(lengths) >= 1 and max(lengths) == 64  # the lognormal often wants more than 64
    assert 1 < np.mean([model.sample_output_tokens(100_000) for _ in range(2_000)]) < 400


def test_latency_config_validation() -> None:
    with pytest.raises(ValueError):
        LatencyConfig(buckets=())
    with pytest.raises(ValueError):
        LatencyConfig(buckets=tuple(reversed(DEFAULT_BUCKETS)))
    with pytest.raises(ValueError):
        LatencyConfig(p99_over_mean_at_1k=4.0, p99_over_mean_at_32k=3.0)


def test_kv_tokens_weight_the_whole_context_by_bucket() -> None:
    assert kv_tokens_for(1_000, 256, DEFAULT_BUCKETS) == 1_256
    assert kv_tokens_for(6_000, 1_000, DEFAULT_BUCKETS) == round(7_000 * 1.8)
    assert kv_tokens_for(30_000, 2_000, DEFAULT_BUCKETS) == round(32_000 * 4.2)


def test_kv_admits_until_full_then_queues_fifo_then_rejects() -> None:
    kv = KvCache(1_000, max_queue=2)
    assert kv.submit("a", 600) is EngineAdmission.ADMITTED
    assert kv.usage_perc == pytest.approx(0.6)
    assert kv.submit("b", 500) is EngineAdmission.QUEUED
    # Strict FIFO: "c" would fit right now but must wait behind "b".
    assert kv.submit("c", 100) is EngineAdmission.QUEUED
    assert kv.submit("d", 100) is EngineAdmission.REJECTED_QUEUE_FULL
    assert (kv.num_running, kv.num_waiting) == (1, 2)
    assert kv.release("a") == ["b", "c"]
    assert (kv.num_running, kv.num_waiting, kv.used_tokens) == (2, 0, 600)
    assert kv.release("b") == [] and kv.release("c") == []
    assert kv.used_tokens == 0 and kv.usage_perc == 0.0


def test_kv_release_of_a_waiting_request_unblocks_the_line() -> None:
    kv = KvCache(1_000)
    assert kv.submit("a", 500) is EngineAdmission.ADMITTED
    assert kv.submit("big", 900) is EngineAdmission.QUEUED
    assert kv.submit("small", 400) is EngineAdmission.QUEUED
    assert kv.release("big") == ["small"]  # the waiting head gave up
    assert kv.release("unknown") == []


def test_kv_refuses_requests_that_can_never_fit_and_caps_running() -> None:
    kv = KvCache(1_000, max_running=2)
    assert kv.submit("huge", 1_001) is EngineAdmission.REJECTED_TOO_LARGE
    assert kv.num_waiting == 0
    assert kv.submit("a", 10) is EngineAdmission.ADMITTED
    assert kv.submit("b", 10) is EngineAdmission.ADMITTED
    assert kv.submit("c", 10) is EngineAdmission.QUEUED
    assert not kv.try_admit("d", 10)
    with pytest.raises(ValueError):
        kv.submit("a", 10)


def test_kv_overcommit_admits_past_capacity_and_says_so() -> None:
    kv = KvCache(1_000, overcommit_ratio=1.5)
    assert kv.submit("a", 900) is EngineAdmission.ADMITTED
    assert not kv.is_overcommitted
    assert kv.submit("b", 500) is EngineAdmission.ADMITTED
    assert kv.is_overcommitted and kv.usage_perc == 1.0


def test_prefix_cache_counts_the_longest_seen_prefix_and_evicts_lru() -> None:
    cache = PrefixCache(max_entries=3)
    first = chain_segments([("system: be brief", 10), ("user: hi", 5)])
    second = chain_segments([("system: be brief", 10), ("user: bye", 6)])
    assert cache.lookup_and_insert(first) == 0
    assert cache.lookup_and_insert(first) == 15
    assert cache.lookup_and_insert(second) == 10
    cache.lookup_and_insert(chain_segments([("other", 3), ("more", 3)]))
    assert cache.lookup_and_insert(first) == 0  # evicted
