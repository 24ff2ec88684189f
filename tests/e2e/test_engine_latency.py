"""The breaker's fast latency signal, end to end: the engines' own TTFT histograms.

Every request here streams for ~30 s. The access log reports a request's TTFT only when it
ends, so without the engines' signal a latency fault on the pool would reach the breaker
only after the streams end. With it, the breaker moves within

    fault TTFT (1.65 s) + scrape interval (1 s) + evaluation interval (0.5 s)
    + L1's enter hold (1 s)  ~= 4.2 s; asserted: 8 s (a shared two-core machine)

while not one of the streams has ended yet.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

from tests.support.http import CHAT, chat_body, metric, scrape
from tests.support.stack import example_policy, fault, level, start_stack, wait_for, write_policy

BOUND_S = 8.0


def _policy(tmp: Path) -> Path:
    raw = example_policy()
    raw["slos"] = {"critical": {"default": 300}, "standard": {"default": 500}}
    breaker = raw["breaker"]
    breaker.update(
        {
            "window_s": 20,
            "min_samples": 5,
            "scrape_interval_s": 1,
            "evaluate_interval_s": 0.5,
            "controller_enabled": False,
        }
    )
    breaker["thresholds"]["enter_hold_s"] = [1, 30, 30]
    return write_policy(tmp / "policy.yaml", raw)


def _open_stream(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = chat_body("tell me a long story", max_tokens=1500, stream=True, ignore_eos=True)
    conn.request(
        "POST",
        CHAT,
        body=json.dumps(body).encode(),
        headers={"authorization": "Bearer sk-demo-critical", "content-type": "application/json"},
    )
    return conn


def test_a_latency_fault_moves_the_breaker_while_every_stream_still_runs(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, _policy(tmp_path), time_scale=1.0)
    streams: list[http.client.HTTPConnection] = []
    try:
        # Healthy first tokens, so the engines' histograms have a before.
        warm = [_open_stream(stack.listen_port) for _ in range(6)]
        for conn in warm:
            assert conn.getresponse().status == 200
        streams += warm
        assert wait_for(lambda: level(stack) == 0, 3)
        time.sleep(2.5)  # a scrape or two of the healthy state
        assert level(stack) == 0
        logged = metric(scrape(stack.metrics_url), "slogate_access_log_entries_total")
        fault(stack, "default", latency_ms=1500)
        started = time.monotonic()
        slow = [_open_stream(stack.listen_port) for _ in range(8)]
        streams += slow
        assert wait_for(lambda: level(stack) >= 1, BOUND_S), stack.logs()
        moved_after_s = time.monotonic() - started
        # Not one request has ended: the access log had nothing to say yet.
        samples = scrape(stack.metrics_url)
        assert metric(samples, "slogate_access_log_entries_total") == logged
        signal = metric(samples, "slogate_breaker_signal", pool="default", signal="p99_over_slo")
        assert signal >= 2.0  # ~1.65 s first tokens against a 0.5 s objective
        print(f"breaker moved {moved_after_s:.1f} s after the fault")
    finally:
        for conn in streams:
            conn.close()
        stack.stop()
