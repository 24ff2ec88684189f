"""The traffic record through the real stack (Envoy, the sidecar, simulated pools): what is
recorded, that no prompt or key is in it, and that replaying it under the same policy gives
the recorded admission outcomes."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.service.traffic_read import read_traffic
from policy.loader import load_policy
from sim.fleet.replay import replay
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, start_stack, wait_for
from tooling.stack.local import LocalStack

PROMPT = "a secret prompt about the quarterly numbers"
KEYS = ("sk-demo-critical", "sk-demo-standard", "sk-demo-batch", "sk-demo-small")


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path]]:
    work = tmp_path_factory.mktemp("record-stack")
    running = start_stack(work, record_dir=work / "traffic")
    yield running, work / "traffic"
    running.stop()


def test_recorded_traffic_replays_with_the_recorded_outcomes(
    recording: tuple[LocalStack, Path],
) -> None:
    stack, directory = recording
    statuses: dict[int, int] = {}
    sent = 0
    for round_ in range(6):
        for key in KEYS:  # sk-demo-small: 5 a minute, so its 6th is refused
            reply = post(
                stack.url,
                CHAT,
                chat_body(f"{PROMPT} {round_}", max_tokens=6, stream=round_ % 2 == 0),
                key=key,
            )
            statuses[reply.status] = statuses.get(reply.status, 0) + 1
            sent += 1
    for _ in range(3):  # refused before any count: no shape, not replayed
        assert post(stack.url, CHAT, chat_body(PROMPT), key="sk-nobody").status == 401
        sent += 1
    assert statuses.get(429) == 1, statuses

    def all_recorded() -> bool:
        return len(read_traffic([directory]).entries) == sent

    assert wait_for(all_recorded, timeout_s=15.0)
    read = read_traffic([directory])
    assert read.problems == [] and len(read.files) == 1
    text = b"".join(gzip.decompress(p.read_bytes()) for p in read.files).decode()
    assert "quarterly" not in text and "sk-demo" not in text  # never text, never keys
    admitted = [e for e in read.entries if e.outcome == "admitted"]
    assert len(admitted) == 23 and all(e.status == 200 for e in admitted)
    assert all(e.usage_completion and e.ttft_ms is not None for e in admitted)
    assert {e.stream for e in admitted} == {True, False}
    refused = sorted(e.verdict for e in read.entries if e.outcome == "refused")
    assert refused == ["refused:budget_requests"] + ["refused:unknown_api_key"] * 3

    report = replay(read.entries, load_policy(EXAMPLE_POLICY))
    agreement = report["agreement"]
    assert agreement["replayed"] == sent - 3
    assert agreement["not_replayed"] == {"refused before counting: unknown_api_key": 3}
    assert agreement["agreement"] >= 0.99, agreement
