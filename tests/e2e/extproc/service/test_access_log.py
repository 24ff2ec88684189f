"""Usage only from the Envoy slogate serves (issue 40, item 3), on the real stack.

An id taken from the sidecar itself (its reservation in the shared Redis, where every replica
and whoever reads Redis sees it), for a request held at the engine, and an access-log entry
naming it with a 503 sent straight to the sidecar's gRPC port: nothing settles. Then the
request's own entry, which slogate's Envoy writes with the id's proof, settles it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import redis

from extproc.request.contract import USAGE_PROOF_FIELD
from policy.domain import hash_api_key
from policy.schema import BudgetStoreKind
from tests.support.http import CHAT, Reply, chat_body, metric, post, scrape
from tests.support.stack import admin_status, fault, settled, start_stack, wait_for
from tooling.benchmarks.driver import SidecarDriver, access_log_entry
from tooling.stack.local import LocalStack

KEY = "sk-demo-standard"
HOLD_MS = 1500  # at the engine: long enough to stop Envoy while the engine works on it
PROOF_LIKE = re.compile(r"[0-9a-f]{32}")  # what a proof looks like (InFlight.proof)


def _held(stack: LocalStack) -> dict[str, Any]:
    """What the sidecar holds of the default pool (its KV ledger in Redis)."""
    rows = admin_status(stack).get("admission", [])
    return next((row for row in rows if row["pool"] == "default"), {})


def _engine_running(stack: LocalStack) -> bool:
    return any(
        metric(scrape(f"{engine}/metrics"), "vllm:num_requests_running") >= 1
        for engine in stack.engine_urls("default")
    )


def _forge(stack: LocalStack, tracking: str) -> None:
    """What an attacker who reaches the port sends: the id, a 503, no proof or a guess."""
    entries = [
        access_log_entry(tracking, 503, None, None),
        access_log_entry(tracking, 503, None, None, proof="0" * 32),
    ]

    async def send() -> None:
        driver = SidecarDriver(f"127.0.0.1:{stack.grpc_port}")
        await driver.send(entries)
        await driver.close()

    asyncio.run(send())


def _entries_seen(samples: dict[Any, float]) -> float:
    """Every access-log entry the sidecar has taken in, whatever it made of it."""
    return metric(samples, "slogate_access_log_entries_total") + metric(
        samples, "slogate_access_log_unproven_total"
    )


def _hold_one(stack: LocalStack, reservations: str, client: redis.Redis) -> tuple[str, Any]:
    """A request held at the engine with Envoy stopped before the engine answered (so no
    entry of it can come): its id, read from the sidecar's reservations, and the thread
    that waits for its answer. None when the engine answered first (a loaded machine)."""
    replies: list[Reply] = []
    thread = threading.Thread(
        target=lambda: replies.append(
            post(stack.url, CHAT, chat_body("hold me", max_tokens=8), key=KEY, timeout_s=120)
        )
    )
    thread.start()
    assert wait_for(lambda: client.hlen(reservations) == 1), "the request was never admitted"
    (raw,) = client.hkeys(reservations)
    assert wait_for(lambda: _engine_running(stack)), "the request never reached the engine"
    assert stack.envoy is not None and stack.envoy.pid is not None
    os.kill(stack.envoy.pid, signal.SIGSTOP)
    if _engine_running(stack):
        return raw.decode(), (thread, replies)
    os.kill(stack.envoy.pid, signal.SIGCONT)
    thread.join(timeout=60)
    assert wait_for(lambda: client.hlen(reservations) == 0), "never settled"
    return "", None


def test_a_forged_entry_naming_a_real_request_settles_nothing(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, budget_store=BudgetStoreKind.REDIS)
    try:
        client = redis.Redis(port=stack.redis_port)
        key_id = hash_api_key(KEY)[:12]
        reservations, usage = f"slogate:{{{key_id}}}:res", f"slogate:{{{key_id}}}:use"
        fault(stack, "default", latency_ms=HOLD_MS)
        for _attempt in range(3):
            tracking, waiting = _hold_one(stack, reservations, client)
            if waiting is not None:
                break
        else:
            raise AssertionError("the engine answered before Envoy stopped, three times")
        thread, replies = waiting
        assert stack.envoy is not None and stack.envoy.pid is not None
        try:
            before = scrape(stack.metrics_url)
            reserved, used, held = client.hgetall(reservations), client.hgetall(usage), _held(stack)
            _forge(stack, tracking)
            assert wait_for(
                lambda: _entries_seen(scrape(stack.metrics_url)) == _entries_seen(before) + 2
            ), "the forged entries never arrived"
            after = scrape(stack.metrics_url)
            still = client.hgetall(reservations), client.hgetall(usage), _held(stack)
        finally:
            os.kill(stack.envoy.pid, signal.SIGCONT)
        fault(stack, "default")

        # Nothing settled: the reservation and the KV hold stay, no usage, no 5xx, same level.
        assert tracking.encode() in reserved and still == (reserved, used, held), still
        assert held["requestsHeld"] == "1"
        unproven = "slogate_access_log_unproven_total"
        assert metric(after, unproven) == metric(before, unproven) + 2
        for name, labels in (
            ("slogate_responses_total", {"pool": "default"}),
            ("slogate_breaker_level", {"pool": "default"}),
            ("slogate_inflight_requests", {}),
            ("slogate_access_log_entries_total", {"kind": "routed"}),
        ):
            assert metric(after, name, **labels) == metric(before, name, **labels), name

        # The request's own entry, from slogate's Envoy, settles it as ever.
        thread.join(timeout=60)
        (reply,) = replies
        assert reply.status == 200, reply.body
        assert wait_for(lambda: client.hlen(reservations) == 0), "never settled"
        done = settled(stack)
        answered = ("slogate_responses_total", "2xx")
        assert metric(done, answered[0], pool="default", code_class=answered[1]) == (
            metric(after, answered[0], pool="default", code_class=answered[1]) + 1
        )
        assert metric(done, "slogate_access_log_unproven_total") == 2
        # Its entry carried the proof (it settled); neither the client's answer nor what the
        # engine saw of slogate's headers (its x-sim-saw-headers echo) shows it.
        engine_saw = json.loads(reply.headers["x-sim-saw-headers"])
        engine_saw.pop("traceparent", None)  # a trace id is 32 hex digits too
        seen = [f"{k}: {v}" for k, v in (*reply.headers.items(), *engine_saw.items())]
        assert not [line for line in seen if PROOF_LIKE.search(line)], seen
        assert not [line for line in seen if USAGE_PROOF_FIELD in line.split(":")[0]], seen
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()
