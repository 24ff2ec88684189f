"""The stack with a real vLLM behind its default pool, for the tests marked `vllm`.

vLLM is an optional extra: without it these tests are skipped, unless
SLOGATE_REQUIRE_VLLM=1 (set by `make test`, which installs it), where a missing vLLM is a
failure rather than a silent skip.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.http import CHAT
from tests.support.stack import example_policy, random_ports, write_policy
from tooling.stack.local import LocalStack
from tooling.stack.processes import free_port
from tooling.stack.vllm_engine import VllmSettings, engine_home, kv_events_args, vllm_available

# Words both tokenizers keep whole (the tiny model's was trained on them): a prompt of N
# of them is about N tokens to slogate's DeepSeek counter and to vLLM alike.
_TEXT = (
    "the fleet serves tokens under load while budgets hold and breakers watch the tail "
    "latency so every tenant keeps its service level objective across pools of engines"
)


def require_vllm() -> None:
    if vllm_available():
        return
    message = "vLLM is not installed (make vllm)"
    if os.environ.get("SLOGATE_REQUIRE_VLLM") == "1":
        pytest.fail(f"{message}, and SLOGATE_REQUIRE_VLLM=1 says it must be", pytrace=False)
    pytest.skip(message)


def words(count: int, seed: int = 0) -> str:
    rng, vocabulary = random.Random(seed), _TEXT.split()
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def vllm_policy(path: Path, kv_ports: tuple[int, int] | None = None) -> Path:
    """The example policy, set for a 10k-token engine that tests fill in seconds; with
    `kv_ports`, the default pool follows its engine's KV events there (PUB, replay)."""
    raw: dict[str, Any] = example_policy()
    raw["pools"]["default"]["priority_scheduling"] = True
    if kv_ports is not None:
        raw["pools"]["default"]["kv_events"] = {
            "port": kv_ports[0],
            "replay_port": kv_ports[1],
            "chat_template": "chatml",
            "tokenizer": str(engine_home() / "tiny-model" / "tokenizer.json"),
        }
    # A transformer's KV per token does not grow with the context: the field's weights are
    # for its fleet; against this engine they would refuse anything past ~5.7k tokens.
    for bucket in raw["buckets"]:
        bucket["kv_weight"] = 1.0
    # The CPU vLLM's prefill starves this 2-core machine, the sidecar included: its reply
    # came later than the 1 s message timeout once in CI (Envoy's 504, ext_proc
    # message_timeouts 1), and later than 5 s once more (a request that was to wait in the
    # room reached it, and sent its timeout override, only after Envoy's 5 s timer: a clean
    # clone's run with two other test runs beside it). What these tests check is vLLM's, not
    # the sidecar's deadline.
    raw["request"]["message_timeout_ms"] = 10_000
    breaker = raw["breaker"]
    breaker["scrape_interval_s"] = 1
    breaker["controller_interval_s"] = 1
    # A test that fills the cache must not trip the breaker: its levels are not under test.
    breaker["thresholds"]["enter_hold_s"] = [600, 600, 600]
    return write_policy(path, raw)


def start_vllm_stack(tmp: Path) -> LocalStack:
    """The stack; its vLLM publishes KV events, and the sidecar follows them
    (tests/e2e/test_vllm_kv_events.py)."""
    kv_ports = (free_port(), free_port())
    return LocalStack(
        vllm_policy(tmp / "policy-vllm.yaml", kv_ports),
        tmp,
        random_ports(),
        time_scale=0.05,
        engine="vllm",
        exact_tokenizer=True,
        vllm=VllmSettings(extra_args=kv_events_args(*kv_ports)),
    ).start()


class Stream:
    """One streamed request, read event by event: a test can stop reading (and hang up)
    whenever it has seen what it needs."""

    def __init__(self, port: int, body: dict[str, Any], key: str | None, path: str = CHAT):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"content-type": "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        self.started = time.monotonic()
        self.conn.request("POST", path, body=json.dumps({**body, "stream": True}), headers=headers)
        self.response = self.conn.getresponse()
        self.first_content_s: float | None = None
        self.events: list[dict[str, Any]] = []
        self._buffer = b""

    def read_event(self) -> dict[str, Any] | None:
        """The next decoded event; None at [DONE] or the end of the body."""
        while b"\n\n" not in self._buffer:
            chunk = self.response.read1(65536)
            if not chunk:
                return None
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n\n", 1)
        text = raw.decode()
        if not text.startswith("data: ") or text == "data: [DONE]":
            return None
        event: dict[str, Any] = json.loads(text[6:])
        self.events.append(event)
        if self.first_content_s is None and any(
            (c.get("delta") or {}).get("content") for c in event.get("choices", [])
        ):
            self.first_content_s = time.monotonic() - self.started
        return event

    def wait_first_content(self) -> float | None:
        while self.first_content_s is None:
            if self.read_event() is None:
                break
        return self.first_content_s

    def read_all(self) -> list[dict[str, Any]]:
        while self.read_event() is not None:
            pass
        self.close()
        return self.events

    def close(self) -> None:
        self.conn.close()
