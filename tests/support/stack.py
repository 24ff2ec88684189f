"""Starting the real stack in tests, waiting for it, and steering it (faults, the CLI)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml

from extproc.adminpb.admin_pb2 import StatusRequest
from extproc.adminpb.admin_pb2_grpc import AdminStub
from extproc.service.admin_auth import TOKEN_FILE_ENV
from extproc.service.admin_client import as_json
from tests.support.http import CHAT, chat_body, metric, post, scrape
from tooling.stack.local import LocalStack, StackPorts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = ROOT / "deploy" / "policy.example.yaml"


def example_policy() -> dict[str, Any]:
    """The example policy as data, for a test to change and `write_policy`."""
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE_POLICY.read_text())
    return loaded


def write_policy(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def random_ports() -> StackPorts:
    return StackPorts(
        listen=0,
        admin=0,
        grpc=0,
        metrics=0,
        admin_api=0,
        pools={
            "default": 0,
            "long": 0,
            "fallback": 0,
        },
    )


def start_stack(tmp: Path, policy: Path = EXAMPLE_POLICY, **options: Any) -> LocalStack:
    options.setdefault("time_scale", 0.05)
    return LocalStack(policy, tmp, random_ports(), **options).start()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Access-log entries are batched by Envoy (100 ms); poll rather than sleep blindly."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def every_decision_ended(now: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> bool:
    """A sidecar's samples say each request it routed has ended (see `settled`)."""
    ended = sum(
        metric(now, "slogate_access_log_entries_total", kind=kind)
        for kind in ("routed", "undelivered", "stream_end")
    )
    return metric(now, "slogate_decisions_total") == ended


def settled(stack: LocalStack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Metrics once every routed request so far has ended: through its access-log entry,
    or as one whose reply Envoy never took (a client gone as the waiting room let it in;
    Envoy's entry without the reply's id ends it) or whose stream saw its end."""

    def all_logged() -> bool:
        return every_decision_ended(scrape(stack.metrics_url))

    # 30 s, not the default 10: a CI machine once held the sidecar's loop 4 s waiting for a
    # CPU, and Envoy batches entries; the wait ends as soon as the counts agree.
    if not wait_for(all_logged, timeout_s=30.0):
        now = scrape(stack.metrics_url)
        seen = {
            (name, labels): value
            for (name, labels), value in now.items()
            if name.startswith(("slogate_access_log", "slogate_decisions", "slogate_inflight"))
        }
        raise AssertionError(f"a routed request never produced an access-log entry: {seen}")
    return scrape(stack.metrics_url)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def charged_as_used(stack: LocalStack) -> tuple[Samples, Samples]:
    """One sheddable request; the sidecar's token counters moved by exactly the usage the
    client was shown (it came back through the access log). The metrics before and after."""
    before = settled(stack)
    reply = post(stack.url, CHAT, chat_body("count to ten", max_tokens=12), key="sk-demo-batch")
    assert reply.status == 200, reply.body
    usage = reply.json()["usage"]
    after = settled(stack)
    for kind, key in (("completion", "completion_tokens"), ("prompt", "prompt_tokens")):
        delta = metric(after, "slogate_tokens_total", pool="default", kind=kind) - metric(
            before, "slogate_tokens_total", pool="default", kind=kind
        )
        assert delta == usage[key], kind
    return before, after


def fault(stack: LocalStack, pool: str, **settings: float) -> None:
    """A fault on every engine of the pool (no settings: cleared)."""
    for engine in stack.engine_urls(pool):
        engine_fault(engine, **settings)


def engine_fault(engine_url: str, **settings: float) -> None:
    """A fault on one engine (no settings: cleared)."""
    data = json.dumps(settings).encode() if settings else None
    method = "POST" if settings else "DELETE"
    request = urllib.request.Request(f"{engine_url}/fault", data=data, method=method)
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def level(stack: LocalStack, pool: str = "default") -> float:
    return metric(scrape(stack.metrics_url), "slogate_breaker_level", pool=pool)


def drive_until(
    stack: LocalStack, done: Callable[[], bool], key: str, timeout_s: float = 30.0
) -> bool:
    """Keep light traffic flowing (the breaker only sees what is served) until `done`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        post(stack.url, CHAT, chat_body("ping", max_tokens=4), key=key)
        if done():
            return True
    return done()


def slogate(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI against the stack's admin API; it finds the stack's admin token as it
    finds one in the sidecar's container: SLOGATE_ADMIN_TOKEN_FILE."""
    assert stack.admin_token_file is not None  # started
    return subprocess.run(
        [sys.executable, "-m", "tooling.cli.main", *args, "--admin", stack.admin_address],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, TOKEN_FILE_ENV: str(stack.admin_token_file)},
    )


def read_stream(
    stack: LocalStack, body: dict[str, object], key: str = "sk-demo-critical"
) -> tuple[http.client.HTTPResponse, list[float], list[str]]:
    """Send a streaming request; the response, chunk arrival times and SSE events."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.listen_port, timeout=30)
    conn.request(
        "POST",
        CHAT,
        body=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    started = time.monotonic()
    response = conn.getresponse()
    arrivals: list[float] = []
    buffer = b""
    while chunk := response.read1(65536):
        arrivals.append(time.monotonic() - started)
        buffer += chunk
    conn.close()
    events = [e for e in buffer.decode().split("\n\n") if e.startswith("data: ")]
    return response, arrivals, events


def is_output_event(event: dict[str, Any]) -> bool:
    """An event that carries a token of output, by each API's own shape (read here from the
    decoded JSON, apart from the sidecar's and the tap's byte patterns): a chat delta with
    text, reasoning or a tool call; completions' text; a Responses `response.*delta`;
    Anthropic's `content_block_delta`."""
    kind = str(event.get("type", ""))
    if kind.startswith("response.") or kind.startswith(("message_", "content_block_")):
        return kind.endswith("delta") and kind != "message_delta"
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if choice.get("text") or delta.get("content") or reasoning or delta.get("tool_calls"):
            return True
    return False


def time_first_output(
    port: int, path: str, body: dict[str, Any], key: str
) -> tuple[float | None, list[dict[str, Any]]]:
    """Stream `body` to `path`: the seconds from sending it to its first output event as
    the client read it (None: none came), and its decoded events."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    started = time.monotonic()
    conn.request("POST", path, body=json.dumps({**body, "stream": True}), headers=headers)
    response = conn.getresponse()
    assert response.status == 200, response.read()
    first_output_s: float | None = None
    events: list[dict[str, Any]] = []
    buffer = b""
    while chunk := response.read1(65536):
        buffer += chunk
        *whole, buffer = buffer.split(b"\n\n")
        for raw in whole:
            data = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
            if not data or data[0] == "[DONE]":
                continue
            events.append(json.loads(data[0]))
            if first_output_s is None and is_output_event(events[-1]):
                first_output_s = time.monotonic() - started
    conn.close()
    return first_output_s, events


def recorded_ttft_s(
    stack: LocalStack, send: Callable[[], object], name: str, **labels: str
) -> float:
    """The TTFT the sidecar recorded for the one request `send` makes: what its histogram
    `name` (with `labels`) gained (no other request may land there meanwhile)."""
    before = scrape(stack.metrics_url)
    count, total = (metric(before, f"{name}_{part}", **labels) for part in ("count", "sum"))
    send()
    assert wait_for(lambda: metric(scrape(stack.metrics_url), f"{name}_count", **labels) > count)
    after = scrape(stack.metrics_url)
    assert metric(after, f"{name}_count", **labels) == count + 1
    return metric(after, f"{name}_sum", **labels) - total


def usage_events(events: list[str]) -> list[dict[str, object]]:
    decoded = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    return [e for e in decoded if e.get("usage")]


def admin_status(stack: LocalStack) -> dict[str, Any]:
    """What `slogate status --json` prints, from the same admin call made in this process:
    starting the CLI takes a second or more on a loaded machine (~5 s while vLLM generates),
    longer than some of the states tests poll for last."""
    with grpc.insecure_channel(stack.admin_address) as channel:
        answer = AdminStub(channel).Status(StatusRequest(), timeout=10)
    loaded: dict[str, Any] = json.loads(as_json(answer))
    return loaded
