"""The breaker's latency signal through the real stack compares like with like: a JSON answer
(not streamed) is held against its whole objective, not against the TTFT SLO its first byte
could never meet; a latency fault still trips the breaker for both kinds of traffic."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import (
    example_policy,
    fault,
    read_stream,
    start_stack,
    write_policy,
)
from tooling.stack.local import LocalStack

PROMPT = (Path(__file__).parents[1] / "data" / "en_prose.txt").read_text() * 6  # ~4k tokens


@pytest.fixture(scope="module")
def signal_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """SLOs that fit the pools' time scale (0.2: everything 5x faster than real)."""
    work = tmp_path_factory.mktemp("signal")
    raw = example_policy()
    raw["breaker"] = {
        "window_s": 6,
        "min_samples": 8,
        "evaluate_interval_s": 0.2,
        "scrape_interval_s": 1,
        "controller_interval_s": 0.5,
        "thresholds": {
            "enter_hold_s": [0.6, 0.6, 0.6],
            "cooldown_s": 1.0,
            "probe_hold_s": 1.0,
            "probe_fraction": 1.0,
        },
    }
    raw["slos"] = {tier: {"default": 250} for tier in ("critical", "standard", "sheddable")}
    raw["tpot_slos"] = {"critical": 10, "standard": 10, "sheddable": 10}
    policy = work / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(work, policy, time_scale=0.2)
    yield stack
    stack.stop()


def snapshot(stack: LocalStack) -> tuple[float, list[float]]:
    samples = scrape(stack.metrics_url)
    worst = max(
        metric(samples, "slogate_breaker_level", pool=p) for p in ("default", "long", "global")
    )
    multipliers = [
        metric(samples, "slogate_quota_multiplier", tier=t)
        for t in ("critical", "standard", "sheddable")
    ]
    return worst, multipliers


def load(
    stack: LocalStack, stream: bool, rate_per_s: float, duration_s: float, **body: object
) -> None:
    """Open-loop arrivals at `rate_per_s`, each request on its own thread."""

    def one() -> None:
        request = chat_body(PROMPT, **body)
        if stream:
            read_stream(stack, {**request, "stream": True}, key="sk-demo-critical")
        else:
            post(stack.url, CHAT, request, key="sk-demo-critical", timeout_s=60)

    threads = []
    start = time.monotonic()
    for i in range(int(rate_per_s * duration_s)):
        time.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        thread = threading.Thread(target=one)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=60)


def test_json_answers_on_a_healthy_pool_keep_every_breaker_at_l0(
    signal_stack: LocalStack,
) -> None:
    """The issue's case: critical, not streamed, ~4k-token prompts, answers of hundreds of
    tokens. Their first byte is their whole answer (~1 s here), four times the 250 ms TTFT
    SLO: judged by it, the pool would reach L3; judged by its objective it is healthy."""
    seen: list[tuple[float, list[float]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(snapshot(signal_stack))
            time.sleep(0.25)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        load(signal_stack, stream=False, rate_per_s=4, duration_s=12, max_tokens=1024)
    finally:
        stop.set()
        watcher.join()
    samples = scrape(signal_stack.metrics_url)
    # There was a signal to read: the JSON answers took far longer than the TTFT SLO.
    ttft_count = metric(samples, "slogate_upstream_ttft_seconds_count", tier="critical")
    slow = ttft_count - metric(
        samples, "slogate_upstream_ttft_seconds_bucket", tier="critical", le="0.3"
    )
    assert ttft_count >= 40 and slow > ttft_count / 2
    assert all(level == 0 for level, _ in seen), seen
    assert all(m == [1.0, 1.0, 1.0] for _, m in seen), seen


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_latency_fault_trips_the_breaker_for_both_kinds(
    signal_stack: LocalStack, stream: bool
) -> None:
    stack = signal_stack
    fault(stack, "default", latency_ms=400)  # ~1.5-2x a short answer's objective
    try:
        deadline = time.monotonic() + 30
        while snapshot(stack)[0] < 1 and time.monotonic() < deadline:
            load(stack, stream=stream, rate_per_s=5, duration_s=2, max_tokens=8, ignore_eos=True)
        assert snapshot(stack)[0] >= 1
    finally:
        fault(stack, "default")
    deadline = time.monotonic() + 40
    while snapshot(stack)[0] > 0 and time.monotonic() < deadline:
        load(stack, stream=stream, rate_per_s=5, duration_s=2, max_tokens=8, ignore_eos=True)
    assert snapshot(stack)[0] == 0
