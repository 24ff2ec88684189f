"""With LiteLLM's environment installed (.venv-litellm), the proxy as `slogate bench overhead`
configures it really enforces the bench key's limits, in memory and in Redis. The arm's
arithmetic: tests/tooling/benchmarks/test_litellm_arm.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tooling.benchmarks import litellm_arm
from tooling.benchmarks.levers import BENCH_KEY
from tooling.benchmarks.wrk import start_envoy, upstream_bootstrap
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis

needs_litellm = pytest.mark.skipif(
    litellm_arm.binary() is None, reason=litellm_arm.missing_message()
)


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[int]:
    port, admin = free_port(), free_port()
    envoy = start_envoy("upstream", upstream_bootstrap(port, admin), admin, tmp_path)
    try:
        yield port
    finally:
        envoy.stop()


def _answers(url: str, n: int, key: str = BENCH_KEY) -> list[tuple[int, str]]:
    body = json.dumps({"model": "deepseek-v4", "messages": [{"role": "user", "content": "hi"}]})
    out = []
    for _ in range(n):
        request = urllib.request.Request(
            url,
            body.encode(),
            {"authorization": f"Bearer {key}", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                out.append((response.status, response.read().decode()))
        except urllib.error.HTTPError as refused:
            out.append((refused.code, refused.read().decode()))
    return out


def _statuses(url: str, n: int, key: str = BENCH_KEY) -> list[int]:
    return [status for status, _ in _answers(url, n, key)]


@needs_litellm
def test_litellm_refuses_the_key_over_its_requests_per_minute(
    tmp_path: Path, upstream: int
) -> None:
    url, proxy = litellm_arm.start_litellm("litellm", tmp_path, upstream, rpm=3)
    try:
        assert _statuses(url, 5) == [200, 200, 200, 429, 429]
        assert _statuses(url, 1, key="sk-unknown") == [401]
    finally:
        proxy.stop()


@needs_litellm
def test_litellm_charges_tokens_to_the_key_in_redis(tmp_path: Path, upstream: int) -> None:
    """The upstream reports 1,002 tokens a request: a budget of 50 a minute admits the
    first. LiteLLM charges a response's tokens after sending it (a success callback), so
    the next request or two may still pass; a refusal for tokens must come soon after."""
    import redis

    server, port = start_redis(tmp_path)
    try:
        url, proxy = litellm_arm.start_litellm(
            "litellm_redis", tmp_path, upstream, tpm=50, redis_port=port
        )
        try:
            answers = _answers(url, 6)
            assert answers[0][0] == 200
            refused = [body for status, body in answers if status == 429]
            assert refused, answers
            assert "Limit type: tokens" in refused[-1]
            keys = redis.Redis(port=port).keys("*:tokens")
            assert keys, "the token counter is not in Redis"
        finally:
            proxy.stop()
    finally:
        server.stop()
