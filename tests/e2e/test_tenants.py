"""Tenants through the real stack (Envoy, the sidecar, simulated pools): a tenant suspended
by a reload is refused at once while its stream in flight runs to its end; a tenant's own
TTFT objective trips the breaker where its tier's would not."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.http import CHAT, chat_body, post
from tests.support.stack import (
    drive_until,
    example_policy,
    fault,
    level,
    slogate,
    start_stack,
    write_policy,
)
from tooling.stack.local import LocalStack

TENANTS: dict[str, Any] = {
    "defaults": {},  # the demo keys' tenants: as before
    "list": {
        "acme": {"tier": "critical"},
        # The critical tier's objective is 5 s here; this tenant's is 250 ms.
        "strict": {"tier": "critical", "slo": {"ttft_p99_ms": 250, "tpot_p99_ms": 5}},
    },
}


@pytest.fixture(scope="module")
def tenant_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The example policy with tenants, lax tier SLOs and a breaker fast enough to test."""
    work = tmp_path_factory.mktemp("tenants")
    raw = example_policy()
    raw["tenants"] = TENANTS
    raw["keys"] += [{"key": "sk-acme", "tenant": "acme"}, {"key": "sk-strict", "tenant": "strict"}]
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
    raw["slos"] = {tier: {"default": 5000} for tier in ("critical", "standard", "sheddable")}
    raw["tpot_slos"] = {tier: 5 for tier in ("critical", "standard", "sheddable")}
    policy = work / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(work, policy)
    yield stack
    stack.stop()


def set_tenants(stack: LocalStack, tenants: dict[str, Any]) -> None:
    """Rewrite the sidecar's policy file with `tenants` and reload it."""
    path = stack.sidecar_policy_path
    assert path is not None
    raw = yaml.safe_load(path.read_text())
    raw["tenants"] = tenants
    write_policy(path, raw)
    done = slogate(stack, "reload")
    assert done.returncode == 0, done.stdout + done.stderr


def stream_in_background(stack: LocalStack, key: str, result: dict[str, Any]) -> threading.Event:
    """A long stream on its own thread; the event is set at its first chunk."""
    started = threading.Event()

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=60)
        body = chat_body("a long answer", max_tokens=8000, stream=True, ignore_eos=True)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        conn.request("POST", CHAT, body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        buffer = b""
        while chunk := response.read1(65536):
            buffer += chunk
            started.set()
        conn.close()
        result["status"] = response.status
        result["events"] = [e for e in buffer.decode().split("\n\n") if e.startswith("data: ")]
        result["ended_s"] = time.monotonic()
        started.set()

    threading.Thread(target=run, daemon=True).start()
    return started


def test_a_suspended_tenant_is_refused_at_once_and_its_stream_in_flight_finishes(
    tenant_stack: LocalStack,
) -> None:
    stack = tenant_stack
    assert post(stack.url, CHAT, chat_body("hi"), key="sk-acme").status == 200
    streamed: dict[str, Any] = {}
    assert stream_in_background(stack, "sk-acme", streamed).wait(30)
    suspended = {**TENANTS, "list": {**TENANTS["list"], "acme": {"suspended": True}}}
    set_tenants(stack, suspended)
    try:
        refused = post(stack.url, CHAT, chat_body("hi"), key="sk-acme")
        refused_s = time.monotonic()
        assert refused.status == 403, refused.body
        error = refused.json()["error"]
        assert error["code"] == "tenant_suspended" and "'acme' is suspended" in error["message"]
        assert refused.headers["x-slogate-reason"] == "tenant_suspended"
        assert "x-sim-pool" not in refused.headers  # no pool saw it
        # Other tenants are not touched.
        assert post(stack.url, CHAT, chat_body("hi"), key="sk-demo-standard").status == 200
        deadline = time.monotonic() + 60
        while "status" not in streamed and time.monotonic() < deadline:
            time.sleep(0.1)
        # The stream admitted before the suspension ran to its end, after the refusal.
        assert streamed["status"] == 200 and streamed["ended_s"] > refused_s
        events = streamed["events"]
        assert events[-1] == "data: [DONE]"
        assert sum('"content"' in e for e in events) >= 8000
    finally:
        set_tenants(stack, TENANTS)
    assert post(stack.url, CHAT, chat_body("hi"), key="sk-acme").status == 200


def test_a_tenants_own_slo_trips_the_breaker_where_its_tiers_would_not(
    tenant_stack: LocalStack,
) -> None:
    """The same critical requests, ~450 ms slow: within the tier's 5 s objective, far past
    the strict tenant's 250 ms."""
    stack = tenant_stack
    assert level(stack) == 0
    fault(stack, "default", latency_ms=450)
    try:
        # A tier's requests alone: several breaker windows of samples, no level.
        assert not drive_until(stack, lambda: level(stack) >= 1, key="sk-acme", timeout_s=8)
        assert drive_until(stack, lambda: level(stack) >= 2, key="sk-strict")  # ~1.8x its SLO
        refused = post(stack.url, CHAT, chat_body("batch"), key="sk-demo-batch")
        assert refused.status == 429 and refused.headers["x-slogate-reason"].startswith("shed_")
    finally:
        fault(stack, "default")
    assert drive_until(stack, lambda: level(stack) == 0, key="sk-acme", timeout_s=40)
