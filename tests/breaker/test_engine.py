"""Signals the breaker reads: vLLM metrics, staleness, P99 against SLOs, the board, NVML."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from admission.signals import record_signals
from breaker.board import GLOBAL, BreakerBoard, engine_objective_s, p99_over_slo
from breaker.engine import (
    ENGINE_METRICS,
    EngineSnapshot,
    histogram_quantile,
    parse_engine_metrics,
    parse_vllm_metrics,
    read_samples,
)
from breaker.latency import SLO_RATIO, ResponseWindows
from breaker.levels import BreakerLevel
from breaker.objectives import latency_objective_s
from extproc.runtime.engines import EngineScraper
from extproc.runtime.gpu import GpuMemory
from policy._reader import PolicyError
from policy.domain import EngineKind, Tier
from policy.loader import parse_policy
from sim.server.config import PoolConfig
from sim.server.pool import create_app
from tests.support.clock import VirtualClock
from tests.support.decisions import decision, outcome
from tests.support.http import serve_on_loopback

VLLM_TEXT = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.91
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 250
"""


def test_vllm_exposition_is_read_worst_kv_and_summed_counts() -> None:
    snapshot = parse_vllm_metrics(VLLM_TEXT)
    assert snapshot == EngineSnapshot(
        0.91, 7.0, 2.0, 0.25, prefix_cache_hits=250.0, prefix_cache_queries=1000.0
    )
    assert parse_vllm_metrics("") == EngineSnapshot(None, None, None, None)


def test_vllm_cache_config_counts_each_engine_once() -> None:
    """KV capacity is blocks x block size per engine: two data-parallel engines add up,
    one engine's info seen twice (from two processes of one server) does not."""
    info = 'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="{n}"}} 1.0\n'
    text = "# TYPE vllm:cache_config_info gauge\n" + "".join(
        info.format(e=e, n=n) for e, n in (("0", "640"), ("0", "640"), ("1", "320"))
    )
    assert parse_vllm_metrics(text).kv_capacity_tokens == 640 * 16 + 320 * 16


SGLANG_TEXT = (Path(__file__).parents[1] / "data" / "sglang_metrics.txt").read_text()


def test_sglang_exposition_is_read_with_sglang_names() -> None:
    snapshot = parse_engine_metrics(SGLANG_TEXT, EngineKind.SGLANG)
    assert (snapshot.kv_cache_usage, snapshot.running, snapshot.waiting) == (0.28, 14.0, 3.0)
    assert snapshot.prefix_cache_hit_rate == 0.0075  # SGLang's own ratio gauge
    assert snapshot.ttft_buckets[-1] == (math.inf, 1000.0)
    assert histogram_quantile(snapshot.ttft_buckets, 0.99) == 5.0
    # Read as vLLM, the same page has no vLLM signals but the stray gauge.
    assert parse_engine_metrics(SGLANG_TEXT) == EngineSnapshot(0.99, None, None, None)


def test_each_pool_is_scraped_with_its_engines_names() -> None:
    async def scenario() -> None:
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=SGLANG_TEXT)

        app.router.add_get("/metrics", metrics)
        runner, port = await serve_on_loopback(app)
        pools = {"sg": [("127.0.0.1", port)], "vl": [("127.0.0.1", port)]}
        scraper = EngineScraper(lambda: pools, lambda: {"sg": EngineKind.SGLANG})
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_once(session)
        assert scraper.kv_cache_usage("sg") == 0.28
        assert scraper.queue_ratio("sg") == pytest.approx(3 / 14)
        assert scraper.kv_cache_usage("vl") == 0.99  # no kind given: vLLM's names
        await runner.cleanup()

    asyncio.run(scenario())


def test_a_pool_names_its_engine() -> None:
    pools = {"default": {"endpoints": ["127.0.0.1:1"], "engine": "sglang"}}
    assert parse_policy({"pools": pools}).pools["default"].engine is EngineKind.SGLANG
    default = parse_policy({}).pools["default"]
    assert default.engine is EngineKind.VLLM
    with pytest.raises(PolicyError, match=r"pools\.default\.engine: expected one of vllm"):
        parse_policy({"pools": {"default": {"endpoints": ["127.0.0.1:1"], "engine": "tgi"}}})


def test_stale_engine_metrics_count_as_saturated() -> None:
    clock = VirtualClock(1000.0)
    scraper = EngineScraper(
        lambda: {"default": [("h", 1), ("h", 2)]}, stale_after_s=15.0, clock=clock
    )
    assert scraper.kv_cache_usage("default") is None  # just started: no verdict yet
    clock.now_s += 16
    assert scraper.kv_cache_usage("default") == 1.0  # never answered: saturated
    scraper.record("default", "h", 1, EngineSnapshot(0.3, 1, 0, None))
    scraper.record("default", "h", 2, EngineSnapshot(0.6, 1, 0, None))
    assert scraper.kv_cache_usage("default") == 0.6
    clock.now_s += 16
    assert scraper.kv_cache_usage("default") == 1.0  # answered once, then went quiet


def test_queue_ratio_sums_fresh_endpoints_and_forgets_stale_ones() -> None:
    clock = VirtualClock(1000.0)
    scraper = EngineScraper(lambda: {"default": [("h", 1), ("h", 2)]}, clock=clock)
    assert scraper.queue_ratio("default") is None  # nothing scraped yet
    scraper.record("default", "h", 1, EngineSnapshot(0.9, 8, 6, None))
    scraper.record("default", "h", 2, EngineSnapshot(0.5, 4, 0, None))
    assert scraper.queue_ratio("default") == pytest.approx(6 / 12)
    clock.now_s += 16
    assert scraper.queue_ratio("default") is None  # stale: the KV signal says saturated


def test_scraper_reads_a_real_simulated_pool() -> None:
    async def scenario() -> None:
        runner, port = await serve_on_loopback(
            create_app(PoolConfig(name="default", time_scale=0.01))
        )
        scraper = EngineScraper(lambda: {"default": [("127.0.0.1", port)]})
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_once(session)
        snapshot = scraper.snapshot("default", "127.0.0.1", port)
        assert snapshot is not None and snapshot.kv_cache_usage == 0.0
        assert scraper.kv_cache_usage("default") == 0.0
        await runner.cleanup()

    asyncio.run(scenario())


POLICY = parse_policy(
    {
        "slos": {"critical": {"default": 1000, "8-32k": 3000}},
        "breaker": {"min_samples": 10, "window_s": 60},
    }
)


def record(
    windows: ResponseWindows,
    pool: str,
    bucket: str,
    seconds: float,
    stream: bool = True,
    output_tokens: int | None = None,
) -> None:
    """What the access-log recorder does with a finished critical request."""
    objective = latency_objective_s(POLICY, Tier.CRITICAL, bucket, stream, output_tokens)
    assert objective is not None
    windows.record_latency(SLO_RATIO, pool, "critical", bucket, seconds / objective)


def test_p99_over_slo_uses_the_bucket_slo_and_needs_enough_samples() -> None:
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    for _ in range(9):
        record(windows, "default", "0-4k", 2.0)
    assert p99_over_slo(windows, POLICY, "default") is None  # 9 < min_samples
    record(windows, "default", "0-4k", 2.0)
    assert math.isclose(p99_over_slo(windows, POLICY, "default") or 0, 2.0, rel_tol=0.06)
    for _ in range(10):
        record(windows, "long", "8-32k", 2.0)
    ratio = p99_over_slo(windows, POLICY, "long")
    assert ratio is not None and ratio < 1.0  # 2 s against the 8-32k bucket's 3 s SLO
    assert POLICY.slo_ms(Tier.CRITICAL, "0-4k") == 1000 and POLICY.slo_ms(Tier.SHEDDABLE, "x")


def test_a_non_streamed_answer_is_held_against_its_whole_objective() -> None:
    """Its first byte is its whole answer: 12 s for 400 tokens is healthy (1 s + 399 x 50 ms
    = 21 s), though twelve times the 1 s TTFT SLO."""
    assert latency_objective_s(POLICY, Tier.CRITICAL, "0-4k", False, 400) == pytest.approx(20.95)
    assert latency_objective_s(POLICY, Tier.CRITICAL, "0-4k", True, 400) == 1.0
    assert latency_objective_s(POLICY, Tier.CRITICAL, "0-4k", False, None) is None
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    for _ in range(20):
        record(windows, "default", "0-4k", 12.0, stream=False, output_tokens=400)
    ratio = p99_over_slo(windows, POLICY, "default")
    assert ratio is not None and ratio < 0.7
    for _ in range(20):  # ... but 60 s for the same answer is not
        record(windows, "default", "0-4k", 60.0, stream=False, output_tokens=400)
    assert (p99_over_slo(windows, POLICY, "default") or 0) > 2.5


def test_board_level_is_the_worse_of_pool_and_global() -> None:
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    board = BreakerBoard(lambda: POLICY, windows, lambda pool: 0.1, lambda: None, clock)
    board.evaluate()
    assert board.level("default") is BreakerLevel.L0
    board.drill(GLOBAL, BreakerLevel.L2, duration_s=60)
    assert board.level("default") is BreakerLevel.L2
    assert board.level("long") is BreakerLevel.L2
    clock.now_s += 61
    assert board.level("default") is BreakerLevel.L2  # as of the last evaluation ...
    board.evaluate()
    assert board.level("default") is BreakerLevel.L0  # ... which the loop runs each second
    assert set(board.names()) == {"default", "long", "fallback", GLOBAL}


def test_gpu_memory_is_unavailable_without_a_gpu_and_never_raises() -> None:
    gpu = GpuMemory()
    usage = gpu.usage()
    if gpu.available:  # a GPU node: a fraction
        assert usage is not None and 0.0 <= usage <= 1.0
    else:  # this machine: unknown, with a reason, and no exception
        assert usage is None and gpu.reason


def test_one_sick_pool_does_not_trip_the_global_breaker() -> None:
    """default carries 90% of the traffic and fails half of it: its own breaker handles it;
    the healthy long pool is not shed because of it. Only when every pool fails does the
    global breaker see a fleet-wide failure."""
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    for i in range(90):
        windows.record_response("default", 500 if i % 2 else 200)
    for _ in range(10):
        windows.record_response("long", 200)
    board = BreakerBoard(lambda: POLICY, windows, lambda pool: 0.1, lambda: None, clock)
    assert board.signals("default").error_rate == 0.5
    assert board.signals(GLOBAL).error_rate == 0.0
    for _ in range(10):
        windows.record_response("long", 503)
    assert board.signals(GLOBAL).error_rate == 0.5  # now every pool with traffic fails


def _ttft_text(counts: dict[str, int]) -> str:
    """A vLLM TTFT histogram exposition (cumulative buckets), as two engines report it."""
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for engine in ("0", "1"):
        for le, count in counts.items():
            lines.append(
                f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",le="{le}",'
                f'model_name="m"}} {count}'
            )
        lines.append(f'vllm:time_to_first_token_seconds_count{{engine="{engine}"}} {count}')
    return "\n".join(lines) + "\n"


def test_the_engines_ttft_histogram_is_read_and_merged() -> None:
    snapshot = parse_vllm_metrics(_ttft_text({"0.1": 5, "0.5": 9, "1.0": 10, "+Inf": 10}))
    assert snapshot.ttft_buckets == ((0.1, 10.0), (0.5, 18.0), (1.0, 20.0), (math.inf, 20.0))
    assert histogram_quantile(snapshot.ttft_buckets, 0.5) == 0.1
    assert histogram_quantile(snapshot.ttft_buckets, 0.99) == 1.0
    assert histogram_quantile(((1.0, 0.0), (math.inf, 0.0)), 0.99) is None
    assert histogram_quantile(((1.0, 1.0), (math.inf, 5.0)), 0.99) == 2.0  # past the last


def test_ttft_quantile_counts_first_tokens_between_scrapes_of_every_endpoint() -> None:
    clock = VirtualClock(1000.0)
    readings = EngineScraper(lambda: {"p": [("h", 1), ("h", 2)]}, clock=clock)

    def scrape(port: int, fast: int, slow: int) -> None:
        buckets = ((0.5, float(fast)), (4.0, float(fast + slow)), (math.inf, float(fast + slow)))
        readings.record("p", "h", port, EngineSnapshot(0.1, 1, 0, None, buckets))

    scrape(1, 1000, 0)  # hours of history before this sidecar started: not in the window
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) is None  # one scrape: no interval
    clock.now_s += 5
    scrape(1, 1100, 0)
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) == 0.5
    scrape(2, 0, 0)
    clock.now_s += 5
    scrape(2, 10, 5)  # the other endpoint turns slow: 5 of its 15 first tokens past 0.5 s
    scrape(1, 1150, 0)
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) == 4.0
    assert readings.ttft_quantile_s("p", 0.5, 60, 5) == 0.5
    assert readings.ttft_quantile_s("p", 0.99, 60, 1000) is None  # too few in the window
    clock.now_s += 70
    scrape(1, 1160, 0)
    scrape(2, 12, 5)  # the slow ones are older than the window now
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) == 0.5
    scrape(2, 3, 0)  # restarted: counts went down, all of them are new
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) == 0.5
    clock.now_s += 20
    assert readings.ttft_quantile_s("p", 0.99, 60, 1) is None  # stale endpoints say nothing


def test_the_engines_ttft_drives_the_latency_signal_against_the_loosest_objective() -> None:
    policy = parse_policy(
        {
            "slos": {
                "critical": {"default": 2000, "32k-128k": 6000},
                "standard": {"default": 4000, "32k-128k": 12000},
                "sheddable": {"default": 15000},
            },
            "routing": {"rules": [{"pool": "long", "min_context_tokens": 32769}]},
        }
    )
    assert engine_objective_s(policy, "default") == 4.0  # standard's, the loosest of two
    assert engine_objective_s(policy, "long") == 12.0
    clock = VirtualClock()
    windows = ResponseWindows(clock=clock, slot_s=5.0, horizon_s=300.0)
    p99 = {"default": 6.0}
    board = BreakerBoard(
        lambda: policy,
        windows,
        kv_cache_usage=lambda pool: None,
        gpu_memory_usage=lambda: None,
        clock=clock,
        engine_ttft=lambda pool, q, window_s, n: p99.get(pool),
    )
    assert board.signals("default").p99_over_slo == pytest.approx(1.5)  # nothing logged yet
    assert board.signals("long").p99_over_slo is None


VLLM_PAGE = (Path(__file__).parents[1] / "data" / "vllm_metrics.txt").read_text()


@pytest.mark.parametrize(
    ("text", "kind"),
    [(VLLM_PAGE, EngineKind.VLLM), (SGLANG_TEXT, EngineKind.SGLANG)],
    ids=["vllm", "sglang"],
)
def test_the_sample_reader_reads_what_prometheus_clients_parser_reads(
    text: str, kind: EngineKind
) -> None:
    """slogate reads an engine's wanted lines itself (breaker.engine.read_samples, ~60x
    faster than parsing the whole page): the same samples as the reference parser."""
    wanted = ENGINE_METRICS[kind].sample_names
    reference = sorted(
        (s.name, sorted(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in wanted
    )
    ours = sorted((n, sorted(labels.items()), v) for n, labels, v in read_samples(text, wanted))
    assert len(ours) >= 5 and ours == reference


def test_the_sample_reader_unescapes_label_values_and_reads_special_values() -> None:
    text = (
        '# HELP x a gauge\nx{path="C:\\\\models\\\\m",note="a \\"quoted\\" }{ word"} NaN\n'
        "x 2.5e3\ny 1\nx_other 3\n"
    )
    samples = list(read_samples(text, frozenset({"x"})))
    assert samples[0][1] == {"path": "C:\\models\\m", "note": 'a "quoted" }{ word'}
    assert math.isnan(samples[0][2]) and samples[1] == ("x", {}, 2500.0) and len(samples) == 2


def test_an_engine_out_of_its_pool_gives_its_status_but_no_latency() -> None:
    """A hung engine's stuck requests end seconds late, once it answers again: they count
    for the error rate (left out while it is out), never for the pool's latency."""
    windows = ResponseWindows(VirtualClock(100.0), slot_s=1.0, horizon_s=60.0)
    routed = decision()
    slow = outcome(routed, ttft_s=9.0, duration_s=9.0, upstream="10.0.0.1:8000")
    record_signals(windows, POLICY, slow, engines_out=frozenset({"10.0.0.1:8000"}))
    assert windows.response_counts(routed.pool, 60) == (1, 0)
    assert windows.merged("total", 60, routed.pool).quantile(0.99) is None
    record_signals(windows, POLICY, slow, engines_out=frozenset({"10.0.0.2:8000"}))
    assert windows.merged("total", 60, routed.pool).quantile(0.99) == pytest.approx(9.0, rel=0.05)


def test_an_engine_back_in_its_pool_counts_first_tokens_from_its_return() -> None:
    clock = VirtualClock(1000.0)
    serving = {"p": [("h", 1), ("h", 2)]}
    readings = EngineScraper(lambda: serving, clock=clock)

    def scrape(port: int, fast: int, slow: int) -> None:
        buckets = ((0.5, float(fast)), (4.0, float(fast + slow)), (math.inf, float(fast + slow)))
        readings.record("p", "h", port, EngineSnapshot(0.1, 1, 0, None, buckets))
        readings.forget_out()

    for port in (1, 2):
        scrape(port, 100, 0)
    serving = {"p": [("h", 1)]}  # the second one hung: taken out on its probes
    clock.now_s += 5
    scrape(1, 200, 0)
    scrape(2, 100, 40)  # it answers again: its stuck requests' first tokens come late
    serving = {"p": [("h", 1), ("h", 2)]}  # and it is back
    clock.now_s += 5
    scrape(1, 300, 0)
    scrape(2, 120, 40)
    assert readings.ttft_quantile_s("p", 0.99, 60, 5) == 0.5  # the 40 stayed its own
