"""A ten-thousand-key policy served through the real Envoy and reloaded while requests flow.
In process: tests/extproc/runtime/test_policy_holder_scale.py."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import start_stack, wait_for
from tooling.benchmarks.tenants import generated_key, many_tenants_policy


@pytest.fixture(scope="module")
def big_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return many_tenants_policy(tmp_path_factory.mktemp("tenants"), tenants=1000, keys=10_000)


def test_ten_thousand_keys_through_envoy_and_reloads_under_load(
    tmp_path: Path, big_policy: Path
) -> None:
    stack = start_stack(tmp_path, big_policy)
    try:
        url = stack.url
        # A key from the middle of the list works; one not in it is refused.
        middle = post(url, CHAT, chat_body(), key=generated_key(5000))
        assert middle.status == 200, middle.body
        unknown = post(url, CHAT, chat_body(), key="sk-gen-99999")
        assert unknown.status == 401, unknown.body
        assert unknown.json()["error"]["code"] == "invalid_api_key", unknown.body
        # Requests flow from two clients while the sidecar reloads the policy three times:
        # every one is answered, by the engine (200) or as refused by its key's own
        # limits (429) — never an Envoy timeout (504) or a reset.
        statuses: list[int] = []
        over = threading.Event()

        def client(index: int) -> None:
            while not over.is_set():
                reply = post(url, CHAT, chat_body(f"q{index}"), key=generated_key(index))
                statuses.append(reply.status)

        threads = [threading.Thread(target=client, args=(i,)) for i in (4000, 6000)]
        for t in threads:
            t.start()
        assert stack.sidecar is not None and stack.sidecar.pid is not None

        def reloads() -> float:
            return metric(scrape(stack.metrics_url), "slogate_policy_reloads_total", result="ok")

        try:
            for count in (1, 2, 3):
                os.kill(stack.sidecar.pid, signal.SIGHUP)
                done = wait_for(lambda n=count: reloads() >= n, timeout_s=60)
                assert done, stack.sidecar.log_text()[-2000:]
        finally:
            over.set()
            for t in threads:
                t.join(60)
        assert statuses and set(statuses) <= {200, 429}, sorted(set(statuses))
        assert statuses.count(200) >= 3
    finally:
        stack.stop()
