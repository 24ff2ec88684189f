"""Default deny through the real Envoy: every path that reaches an engine has an identity,
every inference API is metered, path tricks do not get around either."""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.http import Reply, chat_body, metric, scrape
from tests.support.messages import MODE_IDS, MODES, with_messages
from tests.support.stack import example_policy, settled, slogate, start_stack, write_policy
from tooling.stack.local import LocalStack

CHAT = "/v1/chat/completions"
# One key per API under test, so each key's settled usage is that API's alone.
API_KEYS = {
    name: f"sk-path-{name}"
    for name in (
        "chat",
        "completions",
        "responses",
        "messages",
        "embeddings",
        "invocations_chat",
        "invocations_completion",
        "responses_stream",
        "messages_stream",
        "cheap",
        "tricks",
        "settle",
    )
}
RPM = 500


@pytest.fixture(scope="module", params=MODES, ids=MODE_IDS)
def paths_stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalStack]:
    """Every test here runs with two ext_proc messages per request and with one (policy
    `data_path.messages`)."""
    tmp = tmp_path_factory.mktemp("paths")
    raw = with_messages(example_policy(), request.param)
    raw["keys"] += [
        {
            "key": key,
            "tenant": f"t-{name}",
            "tier": "critical",
            "limits": {"requests_per_minute": RPM, "tokens_per_minute": 10_000_000},
        }
        for name, key in API_KEYS.items()
    ]
    policy = tmp / "policy.yaml"
    write_policy(policy, raw)
    stack = start_stack(tmp, policy)
    yield stack
    stack.stop()


def call(
    stack: LocalStack,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=30)
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=raw, headers=sent)
        response = conn.getresponse()
        return Reply(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


def reached_engine(reply: Reply) -> bool:
    return "x-sim-pool" in reply.headers


def key_usage_1m(stack: LocalStack, tenant: str) -> float:
    reply = json.loads(slogate(stack, "keys", "--tenant", tenant, "--json").stdout)
    (key,) = reply["keys"]
    return float(key.get("usage1m", 0.0))


UNKNOWN_PATHS = [
    "/v1/x",
    "/",
    "/metrics",
    "/fault",
    "/V1/chat/completions",
    "/v1/chat/completions;x",
    "/v1/chat/completions%20",
    "/v1/chat/completions/batch",
    "/v1/responses/resp_123",
    "/v1/messages/batches",
    "/scale_elastic_ep",
    "/reset_prefix_cache",
    "/sleep",
    "/version",
    "/pooling",
    "/generative_scoring",
    "/%68ealth/../scale_elastic_ep",
]


@pytest.mark.parametrize("path", UNKNOWN_PATHS)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("with_key", [False, True])
def test_unknown_and_operational_paths_get_the_gateways_404(
    paths_stack: LocalStack, path: str, method: str, with_key: bool
) -> None:
    key = API_KEYS["tricks"] if with_key else None
    reply = call(paths_stack, method, path, b"{}" if method == "POST" else None, key=key)
    assert reply.status == 404, (path, reply.body)
    assert not reached_engine(reply)
    error = reply.json()
    if path.startswith("/v1/messages"):
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
    else:
        assert error["error"]["code"] == "not_found"


# Spellings of the chat API that an engine, decoding and normalising the path itself, would
# serve: each must meet the same guard as the canonical path.
TRICKS = [
    CHAT,
    "/v1/%63hat/completions",
    "/v1/chat/completion%73",
    "/%76%31/chat/completions",
    "//v1/chat/completions",
    "/v1//chat///completions",
    "/v1/./chat/completions",
    "/v1/x/../chat/completions",
    "/v1/chat/%2e%2e/chat/completions",
    "/v1%2Fchat%2Fcompletions",
    "/v1/chat%5Ccompletions",
    "/v1\\chat\\completions",
    "/v1/chat/completions/",
    "/v1/chat/completions?x=1",
    "/v1/chat/completions/?stream=false",
    "/health/../v1/chat/completions",
]


@pytest.mark.parametrize("path", TRICKS)
def test_path_tricks_meet_the_guard(paths_stack: LocalStack, path: str) -> None:
    anonymous = call(paths_stack, "POST", path, chat_body("hi"))
    assert anonymous.status == 401, (path, anonymous.body)
    assert not reached_engine(anonymous)
    before = scrape(paths_stack.metrics_url)
    served = call(paths_stack, "POST", path, chat_body("hi"), key=API_KEYS["tricks"])
    assert served.status == 200, (path, served.body)
    assert reached_engine(served) and served.headers["x-slogate-pool"] == "default"
    # Metered as the chat API: the sidecar decided on it and the budget answered.
    after = scrape(paths_stack.metrics_url)
    decided = metric(after, "slogate_decisions_total", api="chat_completions") - metric(
        before, "slogate_decisions_total", api="chat_completions"
    )
    assert decided == 1
    assert int(served.headers["x-ratelimit-limit-requests"]) == RPM


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_inference_paths(paths_stack: LocalStack, method: str) -> None:
    assert call(paths_stack, method, CHAT, None).status == 401
    reply = call(paths_stack, method, CHAT, None, key=API_KEYS["tricks"])
    assert reply.status == 405 and reply.headers["allow"] == "POST"
    assert not reached_engine(reply)


@pytest.mark.parametrize(
    "spoofed",
    [
        {"x-envoy-original-path": "/health"},
        {"x-forwarded-prefix": "/health", "x-forwarded-uri": "/health"},
        {"x-original-url": "/health", "x-rewrite-url": "/health"},
        {"x-forwarded-for": "127.0.0.1", "x-forwarded-proto": "https", "x-real-ip": "10.0.0.1"},
        {"x-slogate-pool": "long", "x-slogate-tenant": "admin"},
        {":authority": "internal"},
    ],
)
def test_spoofed_headers_change_nothing(paths_stack: LocalStack, spoofed: dict[str, str]) -> None:
    headers = {k: v for k, v in spoofed.items() if not k.startswith(":")}
    if ":authority" in spoofed:
        headers["host"] = spoofed[":authority"]
    assert call(paths_stack, "POST", CHAT, chat_body("hi"), headers=headers).status == 401
    unknown = call(paths_stack, "POST", "/scale_elastic_ep", b"{}", headers=headers)
    assert unknown.status == 404 and not reached_engine(unknown)
    served = call(paths_stack, "POST", CHAT, chat_body("hi"), API_KEYS["tricks"], headers)
    assert served.status == 200 and served.headers["x-sim-pool"] == "default"
    saw = json.loads(served.headers["x-sim-saw-headers"])
    assert saw["x-slogate-tenant"] == "t-tricks"


def test_public_health_needs_no_key(paths_stack: LocalStack) -> None:
    for path in ("/health", "/health/", "/health?probe=1"):
        reply = call(paths_stack, "GET", path)
        assert reply.status == 200 and reached_engine(reply), path


def _usage_total(usage: dict[str, Any]) -> int:
    if "input_tokens" in usage:
        # Anthropic's input_tokens leaves the prompt cache out (vLLM's Messages usage too).
        cache = ("cache_read_input_tokens", "cache_creation_input_tokens")
        prompt = int(usage["input_tokens"]) + sum(int(usage.get(k, 0)) for k in cache)
        return prompt + int(usage["output_tokens"])
    return int(usage["prompt_tokens"]) + int(usage.get("completion_tokens", 0))


INFERENCE_CASES = [
    ("chat", CHAT, chat_body("meter me", max_tokens=12)),
    ("completions", "/v1/completions", {"prompt": "meter me", "max_tokens": 12}),
    ("responses", "/v1/responses", {"input": "meter me", "max_output_tokens": 12}),
    (
        "messages",
        "/v1/messages",
        {"max_tokens": 12, "system": "s", "messages": [{"role": "user", "content": "meter me"}]},
    ),
    ("embeddings", "/v1/embeddings", {"input": ["meter me", "and me"]}),
    ("invocations_chat", "/invocations", chat_body("meter me", max_tokens=12)),
    ("invocations_completion", "/invocations", {"prompt": "meter me", "max_tokens": 12}),
]


@pytest.mark.parametrize(
    ("name", "path", "body"), INFERENCE_CASES, ids=[c[0] for c in INFERENCE_CASES]
)
def test_every_inference_api_reserves_and_settles(
    paths_stack: LocalStack, name: str, path: str, body: dict[str, Any]
) -> None:
    anonymous = call(paths_stack, "POST", path, body)
    assert anonymous.status == 401 and not reached_engine(anonymous)
    if path == "/v1/messages":
        assert anonymous.json()["type"] == "error"
        assert anonymous.json()["error"]["type"] == "authentication_error"
    key = API_KEYS[name]
    replies = [call(paths_stack, "POST", path, body, key=key) for _ in range(2)]
    for i, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        assert reached_engine(reply)
        assert int(reply.headers["x-ratelimit-remaining-requests"]) == RPM - 1 - i
        assert "x-ratelimit-remaining-tokens" in reply.headers
    settled(paths_stack)
    reported = sum(_usage_total(r.json()["usage"]) for r in replies)
    assert key_usage_1m(paths_stack, f"t-{name}") == reported > 0


def _sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_a_responses_stream_settles_with_its_usage(paths_stack: LocalStack) -> None:
    body = {"input": "stream me", "max_output_tokens": 20, "stream": True}
    reply = call(paths_stack, "POST", "/v1/responses", body, key=API_KEYS["responses_stream"])
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(reply.body)
    completed = [e for e in events if e["type"] == "response.completed"]
    assert len(completed) == 1
    settled(paths_stack)
    expected = _usage_total(completed[0]["response"]["usage"])
    assert key_usage_1m(paths_stack, "t-responses_stream") == expected > 0


def test_an_anthropic_stream_settles_with_its_usage(paths_stack: LocalStack) -> None:
    body = {"max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    reply = call(paths_stack, "POST", "/v1/messages", body, key=API_KEYS["messages_stream"])
    assert reply.status == 200
    events = _sse_events(reply.body)
    started = next(e for e in events if e["type"] == "message_start")
    final = [e for e in events if e["type"] == "message_delta"][-1]
    settled(paths_stack)
    expected = started["message"]["usage"]["input_tokens"] + final["usage"]["output_tokens"]
    assert key_usage_1m(paths_stack, "t-messages_stream") == expected > 0


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/tokenize", {"prompt": "hello"}),
        ("POST", "/detokenize", {"tokens": [1, 2]}),
        ("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_cheap_endpoints_are_authenticated_and_count_as_requests(
    paths_stack: LocalStack, method: str, path: str, body: dict[str, Any] | None
) -> None:
    anonymous = call(paths_stack, method, path, body)
    assert anonymous.status == 401 and not reached_engine(anonymous)
    decided = metric(
        scrape(paths_stack.metrics_url), "slogate_budget_decisions_total", tenant="t-cheap"
    )
    started = time.monotonic()
    first = call(paths_stack, method, path, body, key=API_KEYS["cheap"])
    second = call(paths_stack, method, path, body, key=API_KEYS["cheap"])
    elapsed_s = time.monotonic() - started
    assert first.status == second.status == 200 and reached_engine(second)
    # Each went through the key's budget ...
    assert (
        metric(scrape(paths_stack.metrics_url), "slogate_budget_decisions_total", tenant="t-cheap")
        == decided + 2
    )
    # ... and took one request from it. The bucket refills RPM/60 a second meanwhile (at
    # 500 a minute, 8.3 a second: a clean-clone run once read the same count twice).
    remaining = [int(r.headers["x-ratelimit-remaining-requests"]) for r in (first, second)]
    refilled = elapsed_s * RPM / 60
    assert remaining[0] - 1 <= remaining[1] <= remaining[0] - 1 + math.ceil(refilled)
    settled(paths_stack)


def test_a_request_without_max_tokens_reaches_the_pool_with_the_charged_limit(
    paths_stack: LocalStack,
) -> None:
    body = {"model": "deepseek-v4", "messages": [{"role": "user", "content": "no limit"}]}
    reply = call(paths_stack, "POST", CHAT, body, key=API_KEYS["tricks"])
    assert reply.status == 200
    assert json.loads(reply.headers["x-sim-max-tokens"]) == 1024  # default_max_tokens


def test_n_reserves_n_completions(paths_stack: LocalStack) -> None:
    one = call(paths_stack, "POST", CHAT, chat_body("x", max_tokens=100), key=API_KEYS["chat"])
    eight = call(
        paths_stack, "POST", CHAT, chat_body("x", max_tokens=100, n=8), key=API_KEYS["chat"]
    )
    assert one.status == eight.status == 200

    # The reservation shows in what remains of the tokens-per-minute budget at admission;
    # it refills at 10M a minute, so the bucket is full again before each request.
    def spent(reply: Reply) -> int:
        limit = int(reply.headers["x-ratelimit-limit-tokens"])
        return limit - int(reply.headers["x-ratelimit-remaining-tokens"])

    assert spent(eight) >= 800 > spent(one) >= 100
    too_many = call(paths_stack, "POST", CHAT, chat_body("x", n=1000), key=API_KEYS["chat"])
    assert too_many.status == 400 and too_many.headers["x-slogate-reason"] == "too_many_sequences"
    settled(paths_stack)


def test_a_request_its_pool_waits_for_is_settled_once_through_the_unbatched_log(
    paths_stack: LocalStack,
) -> None:
    """A request that leaves no room in its pool for another like it (~110k tokens of
    context x the long bucket's KV weight fill more than half the long pool) is marked
    settle_promptly, and its entry goes through Envoy's unbatched logger; every entry goes
    through exactly one of the two loggers (one through both would be settled, then come
    again as unmatched). Envoy ignores the metadata matcher's `invert` there: it did."""
    settled(paths_stack)  # the earlier tests' entries are in
    before = scrape(paths_stack.metrics_url)
    key = API_KEYS["settle"]
    large = call(paths_stack, "POST", CHAT, chat_body("fill", max_tokens=110_000), key=key)
    assert large.status == 200, large.body
    assert large.headers["x-slogate-pool"] == "long"
    # Batched after the large one's entry: once it is in, any copy of the large one is too.
    small = call(paths_stack, "POST", CHAT, chat_body("after"), key=key)
    assert small.status == 200, small.body
    settled(paths_stack)
    after = scrape(paths_stack.metrics_url)
    entries = "slogate_access_log_entries_total"
    assert metric(after, entries, kind="unmatched") == metric(before, entries, kind="unmatched")
    assert metric(after, entries, kind="routed") - metric(before, entries, kind="routed") == 2
