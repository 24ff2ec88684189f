"""The data path through the real Envoy, the real sidecar and the simulated pools."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from pathlib import Path

import pytest

from policy._data_path import ExtProcMessages
from policy.domain import FailureMode
from tests.support.http import chat_body, metric, post, scrape
from tests.support.messages import MODE_IDS, MODES, start_stack_with, with_messages
from tests.support.stack import (
    charged_as_used,
    example_policy,
    random_ports,
    read_stream,
    settled,
    usage_events,
    wait_for,
    write_policy,
)
from tooling.stack.local import LocalStack

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module", params=MODES, ids=MODE_IDS)
def messages(request: pytest.FixtureRequest) -> ExtProcMessages:
    """Every test here runs with two ext_proc messages per request and with one
    (policy `data_path.messages`)."""
    mode: ExtProcMessages = request.param
    return mode


@pytest.fixture(scope="module")
def stack(
    messages: ExtProcMessages, stack: LocalStack, request: pytest.FixtureRequest
) -> LocalStack:
    """The shared stack of the mode (conftest's, each started once per session)."""
    if messages is ExtProcMessages.ONE:
        one: LocalStack = request.getfixturevalue("one_message_stack")
        return one
    return stack


def test_short_request_lands_on_default_pool(stack: LocalStack) -> None:
    reply = post(stack.url, CHAT, chat_body("What is the capital of France?"))
    assert reply.status == 200, reply.body
    assert reply.headers["x-slogate-pool"] == "default"
    assert reply.headers["x-sim-pool"] == "default"
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    assert saw["x-slogate-tenant"] == "demo-standard"
    assert saw["x-slogate-bucket"] == "0-4k"
    assert 8 < int(saw["x-slogate-est-tokens"]) < 40
    body = reply.json()
    assert body["usage"]["completion_tokens"] >= 1


def test_40k_token_prompt_lands_on_long_pool(stack: LocalStack) -> None:
    prompt = " word" * 40_000  # one token per " word" for the DeepSeek tokenizer
    reply = post(stack.url, CHAT, chat_body(prompt, max_tokens=16))
    assert reply.status == 200, reply.body
    assert reply.headers["x-slogate-pool"] == "long"
    assert reply.headers["x-sim-pool"] == "long"
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    assert saw["x-slogate-bucket"] == "32k-128k"


def test_client_cannot_pick_the_pool_or_spoof_identity(stack: LocalStack) -> None:
    reply = post(
        stack.url,
        CHAT,
        chat_body("hi"),
        headers={"x-slogate-pool": "long", "x-slogate-tenant": "someone-else"},
    )
    assert reply.status == 200, reply.body
    assert reply.headers["x-sim-pool"] == "default"
    assert json.loads(reply.headers["x-sim-saw-headers"])["x-slogate-tenant"] == "demo-standard"
    # Paths whose body is not read are admitted with their headers, stripped and re-routed.
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=10)
    conn.request(
        "GET",
        "/v1/models",
        headers={"x-slogate-pool": "long", "authorization": "Bearer sk-demo-standard"},
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 200
    assert response.getheader("x-sim-pool") == "default"
    conn.close()


def test_stream_is_not_held_back(stack: LocalStack) -> None:
    response, arrivals, events = read_stream(
        stack, chat_body("tell me a story", max_tokens=120, stream=True)
    )
    assert response.status == 200 and events[-1] == "data: [DONE]"
    # Chunks arrive spread over the stream's life, not all at its end.
    assert len(arrivals) > 5
    assert arrivals[0] < 0.5 * arrivals[-1], arrivals[:3] + arrivals[-3:]


def test_stream_usage_is_accounted_but_only_shown_when_asked(stack: LocalStack) -> None:
    before = settled(stack)
    response, _, events = read_stream(
        stack, chat_body("tell me a story", max_tokens=60, stream=True), key="sk-demo-batch"
    )
    # The pool was asked for usage, the client was not shown it (it did not ask) ...
    assert json.loads(response.getheader("x-sim-stream-options") or "null") == {
        "include_usage": True
    }
    assert usage_events(events) == []
    assert not any('"choices": []' in e or '"choices":[]' in e for e in events)
    decoded = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    content_chunks = [
        e for e in decoded if e["choices"] and e["choices"][0]["delta"].get("content")
    ]
    after = settled(stack)
    # ... yet the sidecar accounted it: one completion token per content chunk.
    completion = metric(after, "slogate_tokens_total", kind="completion") - metric(
        before, "slogate_tokens_total", kind="completion"
    )
    assert completion == len(content_chunks) > 0

    # A client that asks keeps its usage chunk, untouched.
    _, _, asked = read_stream(
        stack,
        chat_body("again", max_tokens=30, stream=True, stream_options={"include_usage": True}),
        key="sk-demo-batch",
    )
    usage = usage_events(asked)
    assert len(usage) == 1 and usage[0]["choices"] == []


def test_usage_and_ttft_reach_sidecar_metrics(stack: LocalStack) -> None:
    before, after = charged_as_used(stack)
    assert metric(after, "slogate_upstream_duration_seconds_count", tier="sheddable") > metric(
        before, "slogate_upstream_duration_seconds_count", tier="sheddable"
    )
    assert metric(after, "slogate_decisions_total", pool="default", tier="sheddable") >= 1


BAD_INPUTS = [
    # (name, body, key, status, error code, rejection reason)
    ("malformed json", b"{not json", "sk-demo-standard", 400, None, "malformed_json"),
    (
        "non utf-8",
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "sk-demo-standard",
        400,
        None,
        "malformed_json",
    ),
    (
        "deeply nested",
        b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "sk-demo-standard",
        400,
        None,
        "malformed_json",
    ),
    ("messages not a list", b'{"messages": "hi"}', "sk-demo-standard", 400, None, "invalid_field"),
    (
        "max_tokens negative",
        json.dumps(chat_body(max_tokens=-1)).encode(),
        "sk-demo-standard",
        400,
        None,
        "invalid_field",
    ),
    (
        "max_tokens string",
        json.dumps(chat_body(max_tokens="9")).encode(),
        "sk-demo-standard",
        400,
        None,
        "invalid_field",
    ),
    (
        "max_tokens huge",
        json.dumps(chat_body(max_tokens=10**12)).encode(),
        "sk-demo-standard",
        400,
        "context_length_exceeded",
        "context_length_exceeded",
    ),
    (
        "missing key",
        json.dumps(chat_body()).encode(),
        None,
        401,
        "invalid_api_key",
        "missing_api_key",
    ),
    (
        "unknown key",
        json.dumps(chat_body()).encode(),
        "sk-wrong",
        401,
        "invalid_api_key",
        "unknown_api_key",
    ),
    (
        "context too long",
        json.dumps(chat_body(" word" * 140_000)).encode(),
        "sk-demo-standard",
        400,
        "context_length_exceeded",
        "context_length_exceeded",
    ),
]


@pytest.mark.parametrize(
    ("body", "key", "status", "code", "reason"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_gets_exact_status_and_openai_error(
    stack: LocalStack, body: bytes, key: str | None, status: int, code: str | None, reason: str
) -> None:
    before = scrape(stack.metrics_url)
    reply = post(stack.url, CHAT, body, key=key)
    assert reply.status == status, reply.body[:300]
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == code and error["message"]
    assert reply.headers["x-slogate-reason"] == reason
    assert "x-sim-pool" not in reply.headers  # never reached a pool
    after = scrape(stack.metrics_url)
    assert (
        metric(after, "slogate_rejections_total", reason=reason)
        == metric(before, "slogate_rejections_total", reason=reason) + 1
    )


def send_while_reading(port: int, head: bytes, body: bytes, chunked: bool) -> tuple[int, bytes]:
    """Send a request while a second thread reads: a server may answer (413) and close
    before the client has finished sending, which a plain HTTP client reports as a reset."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    received = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                received.extend(data)
                if b"\r\n\r\n" in received and b'"error"' in received and received.endswith(b"}"):
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with contextlib.suppress(OSError):
        sock.sendall(head)
        step = 1 << 20
        for start in range(0, len(body), step):
            piece = body[start : start + step]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    reader.join(30)
    sock.close()
    status_line, _, rest = bytes(received).partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_limit_is_413(stack: LocalStack, chunked: bool) -> None:
    too_big = json.dumps(chat_body("x" * (16 * 1024 * 1024 + 4096))).encode()
    framing = (
        b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %d\r\n" % len(too_big)
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer sk-demo-standard\r\n" + framing + b"\r\n"
    )
    status, body = send_while_reading(stack.listen_port, head, too_big, chunked)
    assert status == 413, body[:300]
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_body_just_under_the_limit_passes_envoy_and_grpc(stack: LocalStack) -> None:
    # 15 MiB of prompt: through Envoy's buffer and one gRPC message, then refused by the
    # sidecar for its context length (not by a transport limit).
    big = json.dumps(chat_body("abcd " * (3 * 1024 * 1024))).encode()
    assert len(big) < 16 * 1024 * 1024
    reply = post(stack.url, CHAT, big, timeout_s=60)
    assert reply.status == 400, reply.body[:300]
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_crafted_100k_token_prompt_does_not_stall_the_sidecar(stack: LocalStack) -> None:
    attack = "的" * 100_000  # dense CJK: about one token per character
    reply = post(stack.url, CHAT, chat_body(attack, max_tokens=64), timeout_s=30)
    assert reply.status in (200, 400), reply.body[:300]
    # The sidecar still answers a normal request right after.
    assert post(stack.url, CHAT, chat_body("still there?")).status == 200


def test_non_post_on_inference_path_is_405(stack: LocalStack) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=10)
    conn.request("GET", CHAT, headers={"authorization": "Bearer sk-demo-standard"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 405
    assert body["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("mode", [FailureMode.CLOSED, FailureMode.OPEN])
def test_sidecar_down_follows_failure_mode(
    tmp_path: Path, mode: FailureMode, messages: ExtProcMessages
) -> None:
    local = start_stack_with(tmp_path, messages, failure_mode=mode, exact_tokenizer=False)
    try:
        assert post(local.url, CHAT, chat_body()).status == 200
        local.stop_sidecar()
        reply = post(local.url, CHAT, chat_body())
        if mode is FailureMode.CLOSED:
            assert reply.status == 502, reply.body
            assert reply.json()["error"]["code"] == "gateway_unavailable"
            assert "x-sim-pool" not in reply.headers
        else:
            assert reply.status == 200, reply.body
            assert reply.headers["x-sim-pool"] == "default"
    except BaseException:
        print(local.logs())
        raise
    finally:
        local.stop()


def test_failure_mode_per_path(tmp_path: Path, messages: ExtProcMessages) -> None:
    """Health checks fail open while inference stays closed, with the sidecar down."""
    raw = example_policy()
    raw["request"]["failure_mode_by_path"] = {"/health": "open"}
    local = start_stack_with(tmp_path, messages, raw, exact_tokenizer=False)
    try:
        local.stop_sidecar()
        conn = http.client.HTTPConnection("127.0.0.1", local.listen_port, timeout=10)
        conn.request("GET", "/health")
        health = conn.getresponse()
        health.read()
        conn.close()
        assert health.status == 200 and health.getheader("x-sim-pool") == "default"
        inference = post(local.url, CHAT, chat_body())
        assert inference.status == 502
        assert inference.json()["error"]["code"] == "gateway_unavailable"
    except BaseException:
        print(local.logs())
        raise
    finally:
        local.stop()


def test_shadow_pool_gets_mirrored_traffic_and_decisions_are_logged(
    tmp_path: Path, messages: ExtProcMessages
) -> None:
    raw = with_messages(example_policy(), messages)
    raw["pools"]["shadow"] = {"endpoints": ["127.0.0.1:18004"]}
    raw["shadow"] = {"pool": "shadow", "fraction": 1.0}
    raw["decision_log"] = {"dir": str(tmp_path / "decisions"), "sample_rate": 1.0}
    policy = tmp_path / "policy.yaml"
    write_policy(policy, raw)
    ports = random_ports()
    ports.pools["shadow"] = 0
    local = LocalStack(policy, tmp_path, ports, time_scale=0.05, exact_tokenizer=False).start()
    try:
        for _ in range(3):
            reply = post(local.url, CHAT, chat_body("mirror me"))
            assert reply.status == 200 and reply.headers["x-sim-pool"] == "default"
        assert post(local.url, CHAT, b"{broken").status == 400

        def mirrored() -> float:
            return metric(
                scrape(f"{local.pool_url('shadow')}/metrics"), "vllm:request_success_total"
            )

        assert wait_for(lambda: mirrored() >= 3)
        lines: list[dict[str, object]] = []

        def logged() -> bool:
            nonlocal lines
            files = list((tmp_path / "decisions").glob("decisions-*.jsonl"))
            lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
            return sum(1 for x in lines if x["decision"] == "routed") >= 3

        assert wait_for(logged)
        routed = [x for x in lines if x["decision"] == "routed"]
        assert all(x["pool"] == "default" and x["tenant"] == "demo-standard" for x in routed)
        assert any(x["decision"] == "refused" and x["reason"] == "malformed_json" for x in lines)
        assert "mirror me" not in json.dumps(lines)
    except BaseException:
        print(local.logs())
        raise
    finally:
        local.stop()
