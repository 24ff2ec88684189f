"""`slogate calibrate`: the fit recovers a known model; measuring a simulated pool finds the
latency model it was configured with; the report is a policy section the simulator plays."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from policy.domain import LatencyFit
from policy.loader import load_policy, parse_policy
from sim.server.calibration import Sample, fit_latency, latency_config, pool_spread
from sim.server.config import PoolConfig
from sim.server.model import LatencyConfig
from sim.server.pool import create_app
from tests.support.http import serve_on_loopback
from tooling.loadtest.calibrate import CalibrationError, measure, probe_sizes, report

POLICY = parse_policy({})


def test_fit_recovers_a_noiseless_model() -> None:
    def ttft(tokens: int, slope: float) -> float:
        return 0.4 + 150.0 + 30.0 * tokens / 1000 * slope  # 0.4 ms of network

    tiny = [Sample(10, 0.4 + 150.0)] * 5
    probes = [Sample(2000, ttft(2000, 1.0)), Sample(6000, ttft(6000, 1.3))]
    probes += [Sample(20_000, ttft(20_000, 1.8))]
    fit = fit_latency(tiny, probes, rtt_ms=0.4, buckets=POLICY.buckets)
    assert fit.base_latency_ms == pytest.approx(150.0)
    assert fit.prefill_ms_per_1k_tokens == pytest.approx(30.0)
    assert fit.bucket_slopes == {"0-4k": 1.0, "4-8k": 1.3, "8-32k": 1.8}
    with pytest.raises(ValueError):
        fit_latency([], probes, 0.4, POLICY.buckets)


def test_spread_flags_how_far_pools_lie_apart() -> None:
    fits = {
        "a": LatencyFit(100.0, 30.0, {"0-4k": 1.0}),
        "b": LatencyFit(120.0, 30.0, {"0-4k": 1.0}),
    }
    assert pool_spread(fits) == {"base_latency_ms": 0.2, "prefill_ms_per_1k_tokens": 0.0}
    assert pool_spread({"a": fits["a"]}) == {}


def test_probes_stay_inside_their_buckets_and_under_the_cap() -> None:
    sizes = probe_sizes(POLICY.buckets, max_context=32_768)
    assert len(sizes) == 6 and max(sizes) < 32_768
    for bucket in POLICY.buckets[:3]:
        assert sum(bucket.contains(size) for size in sizes) == 2, bucket.name


async def test_calibrating_a_simulated_pool_finds_its_model(tmp_path: Path) -> None:
    scale = 0.2  # the pool sleeps 0.2x the model's times: the fit must find 0.2x
    runner, port = await serve_on_loopback(create_app(PoolConfig(name="default", time_scale=scale)))
    try:
        measured = await measure(
            "default", f"http://127.0.0.1:{port}/v1", "m", POLICY.buckets, tiny_count=40
        )
    finally:
        await runner.cleanup()
    truth = LatencyConfig()
    fit = measured.fit
    assert fit is not None
    # Bounded looser above than below: a loaded machine only adds time to the pool's sleeps
    # (a clean-clone CI once fitted 36.5 ms for 30), and the pool's own work per prompt token
    # (counting it) slows with the load, steepening the prefill line (9.1 ms for 6 at load
    # 12 on 2 cores). A fit that missed the 0.2 scale would be 5x off either way.
    base_ms = truth.base_latency_ms * scale
    assert 0.8 * base_ms <= fit.base_latency_ms <= 1.5 * base_ms, fit
    prefill_ms = truth.prefill_ms_per_1k_tokens * scale
    assert 0.75 * prefill_ms <= fit.prefill_ms_per_1k_tokens <= 2.0 * prefill_ms, fit
    # The field's slopes 1.3x and 1.8x; the model's tail widens with context, so the
    # longer bucket's mean is the noisier one.
    assert fit.bucket_slopes["4-8k"] == pytest.approx(1.3, rel=0.2)
    assert fit.bucket_slopes["8-32k"] == pytest.approx(1.8, rel=0.3)
    for bucket in POLICY.buckets[:3]:
        assert any(bucket.contains(s.prompt_tokens) for s in measured.probes), bucket.name

    # The report is a policy section: the policy loads with it, the simulator plays it.
    text = report([measured], POLICY.buckets)
    assert "empty-load TTFT P99" in text
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(text)}), encoding="utf-8")
    loaded = load_policy(path).latency_models["default"]
    assert loaded == fit
    config = latency_config(loaded, POLICY.buckets)
    assert config.base_latency_ms == fit.base_latency_ms
    assert [b.prefill_slope for b in config.buckets[:3]] == [
        1.0,
        *list(fit.bucket_slopes.values())[1:3],
    ]


def test_unreachable_endpoint_is_a_clear_error() -> None:
    with pytest.raises(OSError):
        asyncio.run(measure("default", "http://127.0.0.1:9", "m", POLICY.buckets, tiny_count=1))
    with pytest.raises(CalibrationError, match="expected http"):
        asyncio.run(measure("default", "not a url", "m", POLICY.buckets, tiny_count=1))


async def test_an_endpoint_that_refuses_is_reported_with_its_answer() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad key"}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    runner, port = await serve_on_loopback(app)
    try:
        with pytest.raises(CalibrationError, match=r"answered 401.*bad key"):
            await measure("default", f"http://127.0.0.1:{port}", "m", POLICY.buckets)
    finally:
        await runner.cleanup()


def test_latency_model_section_is_checked() -> None:
    with pytest.raises(Exception, match=r"latency_model\.nowhere"):
        parse_policy(
            {"latency_model": {"nowhere": {"base_latency_ms": 1, "prefill_ms_per_1k_tokens": 1}}}
        )
    with pytest.raises(Exception, match=r"bucket_slopes\.9k"):
        parse_policy(
            {
                "latency_model": {
                    "default": {
                        "base_latency_ms": 1,
                        "prefill_ms_per_1k_tokens": 1,
                        "bucket_slopes": {"9k": 1.0},
                    }
                }
            }
        )
