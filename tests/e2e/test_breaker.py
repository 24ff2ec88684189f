"""The breaker through the real stack: faults injected into a simulated pool move it up,
removing them brings it back one level at a time; streams in flight survive."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import (
    drive_until,
    example_policy,
    fault,
    level,
    read_stream,
    start_stack,
    write_policy,
)
from tooling.stack.local import LocalStack


@pytest.fixture(scope="module")
def breaker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The example policy with a breaker fast enough to test: seconds, not minutes."""
    work = tmp_path_factory.mktemp("breaker")
    raw = example_policy()
    raw["model"]["fallback_model"] = "deepseek-v4-lite"
    raw["breaker"] = {
        "window_s": 3,
        "min_samples": 5,
        "evaluate_interval_s": 0.2,
        "scrape_interval_s": 1,
        "stale_after_s": 10,
        "controller_interval_s": 0.3,
        "thresholds": {
            "enter_hold_s": [0.4, 0.4, 0.4],
            "cooldown_s": 1.0,
            "probe_hold_s": 0.8,
            "probe_fraction": 0.0,
        },
    }
    raw["slos"] = {tier: {"default": 250} for tier in ("critical", "standard", "sheddable")}
    # The driving traffic is not streamed: its objective is 250 ms + ~3 x this.
    raw["tpot_slos"] = {tier: 5 for tier in ("critical", "standard", "sheddable")}
    policy = work / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(work, policy)
    yield stack
    stack.stop()


def test_latency_over_slo_sheds_sheddable_keeps_critical_then_recovers(
    breaker_stack: LocalStack,
) -> None:
    stack = breaker_stack
    assert level(stack) == 0
    fault(stack, "default", latency_ms=450)  # P99 TTFT ~1.8x the 250 ms SLO: L2
    try:
        assert drive_until(stack, lambda: level(stack) >= 2, key="sk-demo-critical")
        refused = post(stack.url, CHAT, chat_body("batch job"), key="sk-demo-batch")
        assert refused.status == 429, refused.body  # sheddable: the picker protocol's 429
        assert refused.json()["error"]["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-slogate-reason"] == "shed_tier_shed"
        capped = post(stack.url, CHAT, chat_body(" word" * 9000), key="sk-demo-standard")
        assert capped.status == 503 and "8192" in capped.json()["error"]["message"]
        served = post(stack.url, CHAT, chat_body("urgent"), key="sk-demo-critical")
        assert served.status == 200 and served.headers["x-sim-pool"] == "default"
        # The quota controller saw the same load and shrank the sheddable budgets first.
        assert drive_until(
            stack,
            lambda: (
                metric(scrape(stack.metrics_url), "slogate_quota_multiplier", tier="sheddable")
                < 1.0
            ),
            key="sk-demo-critical",
        )
        samples = scrape(stack.metrics_url)
        assert metric(samples, "slogate_quota_multiplier", tier="critical") == 1.0
        assert metric(samples, "slogate_load_score", kind="measured") > 1.0
    finally:
        fault(stack, "default")
    assert drive_until(stack, lambda: level(stack) == 0, key="sk-demo-critical")
    samples = scrape(stack.metrics_url)
    # Down one level at a time: 2 -> 1 and 1 -> 0 both happened.
    for from_level, to_level in (("L2", "L1"), ("L1", "L0")):
        assert (
            metric(
                samples,
                "slogate_breaker_transitions_total",
                pool="default",
                from_level=from_level,
                to_level=to_level,
            )
            >= 1
        )
    assert post(stack.url, CHAT, chat_body("batch job"), key="sk-demo-batch").status == 200


def test_error_surge_sends_critical_to_fallback_and_streams_survive(
    breaker_stack: LocalStack, tmp_path: Path
) -> None:
    stack = breaker_stack
    assert drive_until(stack, lambda: level(stack) == 0, key="sk-demo-critical")
    finished: dict[str, object] = {}

    def long_stream() -> None:
        response, _, events = read_stream(
            stack,
            chat_body("a long answer", max_tokens=1500, stream=True, ignore_eos=True),
            key="sk-demo-batch",
        )
        finished["status"] = response.status
        finished["events"] = events

    streamer = threading.Thread(target=long_stream)
    streamer.start()
    time.sleep(0.3)  # admitted and streaming before the surge
    fault(stack, "default", error_rate=1.0, error_status=500)
    try:
        assert drive_until(stack, lambda: level(stack) == 3, key="sk-demo-standard")
        critical = post(stack.url, CHAT, chat_body("urgent"), key="sk-demo-critical")
        assert critical.status == 200, critical.body
        assert critical.headers["x-slogate-pool"] == "fallback"
        assert critical.headers["x-sim-pool"] == "fallback"
        assert json.loads(critical.headers["x-sim-model"]) == "deepseek-v4-lite"
        standard = post(stack.url, CHAT, chat_body("normal"), key="sk-demo-standard")
        assert standard.status == 503
    finally:
        fault(stack, "default")
    streamer.join(60)
    # The stream admitted before the surge ran to its end through every transition.
    assert finished["status"] == 200
    events = finished["events"]
    assert isinstance(events, list) and events[-1] == "data: [DONE]"
    assert sum('"content"' in e for e in events) >= 1500
    assert drive_until(stack, lambda: level(stack) == 0, key="sk-demo-critical", timeout_s=40)
    back = post(stack.url, CHAT, chat_body("normal"), key="sk-demo-standard")
    assert back.status == 200 and back.headers["x-sim-pool"] == "default"


def test_drill_forces_a_level_and_shows_in_metrics(breaker_stack: LocalStack) -> None:
    from tests.support.stack import slogate

    stack = breaker_stack
    assert (
        slogate(stack, "drill", "--pool", "default", "--level", "3", "--minutes", "1").returncode
        == 0
    )
    try:
        samples = scrape(stack.metrics_url)
        assert metric(samples, "slogate_breaker_level", pool="default") == 3
        assert metric(samples, "slogate_breaker_drill_level", pool="default") == 3
        assert post(stack.url, CHAT, chat_body("x"), key="sk-demo-standard").status == 503
    finally:
        assert (
            slogate(
                stack, "drill", "--pool", "default", "--level", "0", "--minutes", "0"
            ).returncode
            == 0
        )
    assert level(stack) == 0
