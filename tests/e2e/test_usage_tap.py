"""Both usage taps (`data_path.usage_tap: lua | native`) through the real Envoy and the
simulated vLLM: every API's usage, streamed and not, reaches the sidecar and settles the
caller's key at exactly what the engine reported; the usage event the sidecar asked for stays
hidden; `native` really reads the JSON bodies with Envoy's json_to_metadata; and every API's
stream is timed at its first output event (a Responses stream's first bytes come before any
token)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from tests.e2e.test_paths import _sse_events, _usage_total, call, key_usage_1m
from tests.support.http import chat_body, metric
from tests.support.stack import (
    example_policy,
    fault,
    read_stream,
    recorded_ttft_s,
    settled,
    start_stack,
    time_first_output,
    usage_events,
    write_policy,
)
from tooling.stack.local import LocalStack

CHAT = "/v1/chat/completions"
ANTHROPIC = {"system": "s", "messages": [{"role": "user", "content": "meter me"}]}
# name: (path, body, streamed)
CASES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "chat": (CHAT, chat_body("meter me", max_tokens=12), False),
    "completions": ("/v1/completions", {"prompt": "meter me", "max_tokens": 12}, False),
    "responses": ("/v1/responses", {"input": "meter me", "max_output_tokens": 12}, False),
    "messages": ("/v1/messages", {"max_tokens": 12, **ANTHROPIC}, False),
    "chat_stream": (
        CHAT,
        chat_body("meter me", max_tokens=12, stream=True, stream_options={"include_usage": True}),
        True,
    ),
    "completions_stream": (
        "/v1/completions",
        {
            "prompt": "meter me",
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        True,
    ),
    "responses_stream": (
        "/v1/responses",
        {"input": "meter me", "max_output_tokens": 12, "stream": True},
        True,
    ),
    "messages_stream": ("/v1/messages", {"max_tokens": 12, "stream": True, **ANTHROPIC}, True),
}
STRIPPED = "chat_stream_unasked"  # a stream whose usage event the sidecar asked for itself


class Tap(NamedTuple):
    mode: str
    stack: LocalStack


def _key(name: str) -> str:
    return f"sk-tap-{name}"


@pytest.fixture(scope="module", params=["lua", "native"])
def tap(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tap]:
    tmp = tmp_path_factory.mktemp(f"tap-{request.param}")
    raw = example_policy()
    raw["data_path"] = {"usage_tap": request.param}
    raw["keys"] += [
        {
            "key": _key(name),
            "tenant": f"t-{name}",
            "tier": "critical",
            "limits": {"requests_per_minute": 500, "tokens_per_minute": 10_000_000},
        }
        for name in [*CASES, STRIPPED]
    ]
    stack = start_stack(tmp, write_policy(tmp / "policy.yaml", raw))
    yield Tap(request.param, stack)
    stack.stop()


def _split(usage: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) of one usage object; Anthropic's prompt cache counts as prompt."""
    total = _usage_total(usage)
    completion = int(usage.get("completion_tokens", usage.get("output_tokens", 0)))
    return total - completion, completion


def _reported(name: str, body: bytes, streamed: bool) -> tuple[int, int]:
    """What the engine said it used, read from what the client received."""
    if not streamed:
        return _split(json.loads(body)["usage"])
    events = _sse_events(body)
    if name == "responses_stream":
        (done,) = [e for e in events if e["type"] == "response.completed"]
        return _split(done["response"]["usage"])
    if name == "messages_stream":
        start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
        final = [e for e in events if e["type"] == "message_delta"][-1]["usage"]
        return _split({**start, **final})
    (usage,) = [e["usage"] for e in events if e.get("usage")]
    return _split(usage)


def _tokens(metrics: Any, kind: str) -> float:
    return metric(metrics, "slogate_tokens_total", kind=kind)


def _envoy_stat(stack: LocalStack, name: str) -> int:
    url = f"http://127.0.0.1:{stack.admin_port}/stats?filter={name}&format=json"
    with urllib.request.urlopen(url, timeout=5) as reply:
        stats = json.load(reply)["stats"]
    return sum(int(s.get("value", 0)) for s in stats if s.get("name") == name)


@pytest.mark.parametrize("name", list(CASES))
def test_every_usage_shape_settles_at_what_the_engine_reported(tap: Tap, name: str) -> None:
    tap_stack = tap.stack
    path, body, streamed = CASES[name]
    before = settled(tap_stack)
    reply = call(tap_stack, "POST", path, body, key=_key(name))
    assert reply.status == 200, reply.body
    if streamed:
        assert reply.headers["content-type"].startswith("text/event-stream")
    prompt, completion = _reported(name, reply.body, streamed)
    after = settled(tap_stack)
    assert key_usage_1m(tap_stack, f"t-{name}") == prompt + completion
    # The usage itself reached the sidecar (without it the key would settle at the
    # sidecar's own prompt count, which the simulator matches).
    assert _tokens(after, "prompt") - _tokens(before, "prompt") == prompt > 0
    assert _tokens(after, "completion") - _tokens(before, "completion") == completion > 0


def test_native_reads_json_bodies_in_envoy(tap: Tap) -> None:
    tap_stack = tap.stack
    before = _envoy_stat(tap_stack, "json_to_metadata.resp.success")
    reply = call(tap_stack, "POST", CHAT, chat_body("count me", max_tokens=5), key=_key("chat"))
    assert reply.status == 200
    settled(tap_stack)
    read = _envoy_stat(tap_stack, "json_to_metadata.resp.success") - before
    assert read == (1 if tap.mode == "native" else 0)


def test_a_usage_event_the_client_did_not_ask_for_is_read_and_hidden(tap: Tap) -> None:
    tap_stack = tap.stack
    before = settled(tap_stack)
    response, _, events = read_stream(
        tap_stack, chat_body("tell me a story", max_tokens=40, stream=True), key=_key(STRIPPED)
    )
    assert response.status == 200
    assert usage_events(events) == []  # cut out by the Lua, in both modes
    decoded = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    content = [e for e in decoded if e["choices"] and e["choices"][0]["delta"].get("content")]
    after = settled(tap_stack)
    completion = metric(after, "slogate_tokens_total", kind="completion") - metric(
        before, "slogate_tokens_total", kind="completion"
    )
    assert completion == len(content) > 0  # the simulator sends one token per chunk


PREFILL_S = 0.3  # the simulated engine's added time to first token (real seconds)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[2]])
def test_every_api_s_stream_is_timed_at_its_first_output_event(tap: Tap, name: str) -> None:
    """The engine takes PREFILL_S more to its first token; a Responses stream has sent
    `response.created` and `response.in_progress` by then (its first byte: ~0 s)."""
    path, body, _ = CASES[name]
    client: list[float | None] = []

    def send() -> None:
        first_output_s, events = time_first_output(tap.stack.listen_port, path, body, _key(name))
        client.append(first_output_s)
        assert events

    fault(tap.stack, "default", latency_ms=PREFILL_S * 1000)
    try:
        ttft_s = recorded_ttft_s(tap.stack, send, "slogate_tenant_ttft_seconds", tenant=f"t-{name}")
    finally:
        fault(tap.stack, "default")
    (client_s,) = client
    assert client_s is not None
    # Envoy times from the request's first byte to the first output event as it passed:
    # within what the client saw (ms rounding aside), and never before the engine's delay.
    assert PREFILL_S * 0.99 <= ttft_s <= client_s + 0.005, (ttft_s, client_s)
