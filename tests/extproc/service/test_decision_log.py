"""The decision log: sampled JSON lines per UTC day, no prompt text, old days deleted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from admission.decision import CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited
from extproc.service.decision_log import DecisionLog
from policy.domain import ApiKey, ContextBucket, Tier
from tests.support.clock import VirtualClock
from tests.support.decisions import Seen

DAY_S = 86_400.0
SECRET = "sk-very-secret"


def outcome() -> RequestOutcome:
    decision = RoutingDecision(
        request_id="req-1",
        caller=ApiKey("ef" * 32, "acme", Tier.STANDARD),
        pool="default",
        bucket=ContextBucket("0-4k", 0, 4096, 1.0),
        prompt_tokens=120,
        max_tokens=64,
        estimate=CountKind.CACHED,
        stream=False,
    )
    return RequestOutcome(decision, "t1", 200, 110, 40, 0.25, 1.5, "via_upstream")


def record(log: DecisionLog) -> None:
    asyncio.run(log.record(outcome()))


def test_lines_carry_the_decision_and_usage_never_secrets(tmp_path: Path) -> None:
    clock = VirtualClock(1_790_000_000.0)
    log = DecisionLog(tmp_path, sample_rate=1.0, clock=clock)
    record(log)
    refusal = RateLimited(f"limit for {SECRET}", reason="budget_tokens")
    log.refused(Seen("req-2", ApiKey("ef" * 32, "acme", Tier.STANDARD)), refusal)
    log.close()
    (path,) = tmp_path.glob("decisions-*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    routed, refused = lines
    assert routed["key_id"] == "ef" * 6 and routed["tenant"] == "acme"
    assert routed["pool"] == "default" and routed["completion_tokens"] == 40
    assert routed["ttft_ms"] == 250.0 and routed["estimate"] == "cached"
    assert refused == {
        "request_id": "req-2",
        "tenant": "acme",
        "decision": "refused",
        "reason": "budget_tokens",
        "status": 429,
        "time": refused["time"],
    }
    assert SECRET not in path.read_text()  # messages are not logged, only reasons


def test_one_file_per_day_and_old_days_are_deleted(tmp_path: Path) -> None:
    clock = VirtualClock(1_790_000_000.0)
    log = DecisionLog(tmp_path, sample_rate=1.0, keep_days=2, clock=clock)
    for _ in range(4):
        record(log)
        clock.now_s += DAY_S
    log.close()
    files = sorted(p.name for p in tmp_path.glob("decisions-*.jsonl"))
    assert len(files) == 2  # days 3 and 4; days 1 and 2 were older than keep_days


def test_sampling_keeps_about_the_rate(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, sample_rate=0.1, clock=VirtualClock(1_790_000_000.0))
    for _ in range(2000):
        record(log)
    log.close()
    (path,) = tmp_path.glob("decisions-*.jsonl")
    assert 120 <= len(path.read_text().splitlines()) <= 280
