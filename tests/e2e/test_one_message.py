"""One ext_proc message per request (policy `data_path.messages: one`) through the real Envoy
and sidecar: inference requests are decided on their body alone, and the two holes a skipped
header phase opens stay closed — a body-less request never passes unguarded, and the
upstream headers only slogate sets cannot be spoofed. (The data-path and every-path suites
run in this mode too: tests/e2e/test_data_path.py, tests/e2e/test_paths.py.)"""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from tests.support.http import chat_body, metric, post, scrape
from tooling.stack.local import LocalStack

CHAT = "/v1/chat/completions"
INFERENCE_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
    "/invocations",
]


def phase_count(stack: LocalStack, phase: str) -> float:
    return metric(scrape(stack.metrics_url), "slogate_decision_seconds_count", phase=phase)


def send_raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request written as given (http.client always declares a POST's length)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()


def test_an_inference_request_is_one_message(one_message_stack: LocalStack) -> None:
    stack = one_message_stack
    headers_before = phase_count(stack, "request_headers")
    bodies_before = phase_count(stack, "request_body")
    reply = post(stack.url, CHAT, chat_body("one message"), chunked=False)
    assert reply.status == 200, reply.body[:300]
    assert phase_count(stack, "request_body") == bodies_before + 1
    assert phase_count(stack, "request_headers") == headers_before
    # A chunked body declares no length: its route sends the headers too (two messages),
    # since routes cannot tell it from a request without a body (one_message module).
    chunked = post(stack.url, CHAT, chat_body("two messages, chunked"), chunked=True)
    assert chunked.status == 200, chunked.body[:300]
    assert phase_count(stack, "request_body") == bodies_before + 2
    assert phase_count(stack, "request_headers") == headers_before + 1
    # Decided: the sidecar's headers reached the pool (from metadata, through the route).
    for answer in (reply, chunked):
        saw = json.loads(answer.headers["x-sim-saw-headers"])
        assert saw["x-slogate-tenant"] == "demo-standard"
        assert saw["x-slogate-pool"] == answer.headers["x-sim-pool"] == "default"


@pytest.mark.parametrize("path", INFERENCE_PATHS)
def test_a_declared_empty_body_is_refused_by_envoy(
    one_message_stack: LocalStack, path: str
) -> None:
    stack = one_message_stack
    before = scrape(stack.metrics_url)
    status, headers, body = send_raw(
        stack.listen_port,
        f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-demo-standard\r\n"
        "content-type: application/json\r\ncontent-length: 0\r\n\r\n".encode(),
    )
    assert status == 400, body[:300]
    assert headers["x-slogate-reason"] == "missing_body"
    assert "x-sim-pool" not in headers  # never reached a pool
    error = json.loads(body)
    if path.startswith("/v1/messages"):
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    # Envoy answered: the sidecar saw no message of it.
    after = scrape(stack.metrics_url)
    for phase in ("request_headers", "request_body"):
        assert metric(after, "slogate_decision_seconds_count", phase=phase) == metric(
            before, "slogate_decision_seconds_count", phase=phase
        )


@pytest.mark.parametrize(
    ("key", "status", "reason"),
    [("sk-demo-standard", 400, "missing_body"), (None, 401, "missing_api_key")],
    ids=["with-key", "without-key"],
)
def test_a_request_without_a_declared_length_gets_its_header_message(
    one_message_stack: LocalStack, key: str | None, status: int, reason: str
) -> None:
    """No content-length and no transfer-encoding: the route processes it in two messages,
    so the sidecar refuses it on its headers exactly as in the two-message mode."""
    stack = one_message_stack
    headers_before = phase_count(stack, "request_headers")
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    got, headers, body = send_raw(
        stack.listen_port, f"POST {CHAT} HTTP/1.1\r\nhost: x\r\n{auth}\r\n".encode()
    )
    assert got == status, body[:300]
    assert headers["x-slogate-reason"] == reason
    assert "x-sim-pool" not in headers
    assert phase_count(stack, "request_headers") == headers_before + 1


def test_body_less_paths_keep_their_header_message(one_message_stack: LocalStack) -> None:
    stack = one_message_stack
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=10)
    try:
        conn.request("GET", "/v1/models")  # an API whose body is not read: identity first
        refused = conn.getresponse()
        refused_body = refused.read()
        conn.request("GET", "/v1/models", headers={"authorization": "Bearer sk-demo-standard"})
        models = conn.getresponse()
        models.read()
        conn.request("GET", "/health", headers={"x-slogate-tenant": "spoofed"})
        health = conn.getresponse()
        health.read()
    finally:
        conn.close()
    assert refused.status == 401, refused_body[:300]
    assert refused.getheader("x-slogate-reason") == "missing_api_key"
    assert models.status == 200
    assert models.getheader("x-ratelimit-limit-requests")  # admitted as one request
    assert health.status == 200
