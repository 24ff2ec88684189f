"""Talking to the stack over HTTP the way clients do, and reading its metrics."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"


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
        return parse(response.read().decode())


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
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


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, int]:
    """An in-process aiohttp app on a free loopback port: its runner (to clean up) and port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port
