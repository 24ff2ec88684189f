"""Budgets through the real stack: Envoy, the sidecar (in-process store), simulated pools."""

from __future__ import annotations

import time

from tests.support.http import CHAT, chat_body, metric, post
from tests.support.stack import settled
from tooling.stack.local import LocalStack

RATE_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def test_rate_limit_headers_count_down(stack: LocalStack) -> None:
    first = post(stack.url, CHAT, chat_body("one"), key="sk-demo-critical")
    second = post(stack.url, CHAT, chat_body("two"), key="sk-demo-critical")
    assert first.status == second.status == 200
    for name in RATE_HEADERS:
        assert name in first.headers, name
    assert first.headers["x-ratelimit-limit-requests"] == "600"
    assert int(second.headers["x-ratelimit-remaining-requests"]) < int(
        first.headers["x-ratelimit-remaining-requests"]
    )
    assert first.headers["x-ratelimit-reset-tokens"].endswith(("ms", "s"))


def test_small_key_gets_429_then_is_admitted_again(stack: LocalStack) -> None:
    """sk-demo-small allows 5 requests a minute: the 6th waits for one to refill (12 s)."""
    statuses = []
    refused = None
    for _ in range(8):
        reply = post(stack.url, CHAT, chat_body("hi", max_tokens=4), key="sk-demo-small")
        statuses.append(reply.status)
        if reply.status == 429:
            refused = reply
            break
    assert refused is not None, statuses
    assert statuses.count(200) <= 5
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_exceeded"
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 12
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-slogate-reason"] == "budget_requests"
    assert "x-sim-pool" not in refused.headers  # refused before any pool saw it

    # Another tenant is not affected by this one's exhaustion.
    other = post(stack.url, CHAT, chat_body("hi"), key="sk-demo-standard")
    assert other.status == 200 and int(other.headers["x-ratelimit-remaining-requests"]) > 0

    time.sleep(retry_after)
    again = post(stack.url, CHAT, chat_body("hi", max_tokens=4), key="sk-demo-small")
    assert again.status == 200, again.body


def test_stream_is_charged_its_real_usage_not_max_tokens(stack: LocalStack) -> None:
    before = settled(stack)
    reply = post(
        stack.url,
        CHAT,
        chat_body(
            "write a long story",
            max_tokens=2000,
            stream=True,
            stream_options={"include_usage": True},
        ),
        key="sk-demo-batch",
    )
    assert reply.status == 200
    chunks = [e for e in reply.body.decode().split("\n\n") if '"usage":{' in e]
    usage = __import__("json").loads(chunks[-1][6:])["usage"]
    after = settled(stack)

    def charged() -> float:
        return metric(settled(stack), "slogate_tenant_tokens_total", tenant="demo-batch") - metric(
            before, "slogate_tenant_tokens_total", tenant="demo-batch"
        )

    # Settlement runs right after the access-log entry; poll briefly for it.
    deadline = time.monotonic() + 5
    while charged() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert charged() == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] < 2000  # so the reservation would have been larger
    assert metric(after, "slogate_budget_decisions_total", tenant="demo-batch", result="ok") >= 1
