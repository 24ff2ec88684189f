"""Shared fixtures: the real stack (simulated pools, sidecar, Envoy) on random ports.

Process logs are attached to a test's report only when the test fails.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from extproc.stack import LocalStack, StackPorts

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_POLICY = ROOT / "deploy" / "policy.example.yaml"


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


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    running = start_stack(tmp_path_factory.mktemp("stack"))
    yield running
    running.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name in getattr(item, "fixturenames", ()):
            value = getattr(item, "funcargs", {}).get(name)
            if isinstance(value, LocalStack):
                report.sections.append((f"process logs ({name})", value.logs()))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def post(
    url: str,
    path: str,
    body: bytes | dict[str, Any],
    key: str | None = "sk-demo-standard",
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    chunked: bool = False,
    ssl_context: ssl.SSLContext | None = None,
) -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scheme, _, address = url.partition("://")
    host, port = address.split(":")
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, int(port), timeout=timeout_s, context=ssl_context)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    sent = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    try:
        if chunked:
            conn.request("POST", path, body=iter([raw]), headers=sent, encode_chunked=True)
        else:
            conn.request("POST", path, body=raw, headers=sent)
        response = conn.getresponse()
        return Reply(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


def chat_body(content: str = "hello", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
    }
    body.update(fields)
    return body


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(
        value
        for (n, ls), value in samples.items()
        if n == name and all((k, v) in ls for k, v in labels.items())
    )
