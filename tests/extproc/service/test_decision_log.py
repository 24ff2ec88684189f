"""The decision log: sampled JSON lines per UTC day, no prompt text, old days deleted,
written by a thread: a disk that hangs never holds the event loop."""

from __future__ import annotations

import json
import time
from pathlib import Path

from admission.decision import CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited
from extproc.service.decision_log import DECISION_FILES, DecisionLog
from extproc.service.record_files import RecordFiles
from policy.domain import ApiKey, ContextBucket, Tier
from tests.support.clock import VirtualClock
from tests.support.decisions import Seen
from tests.support.record_writers import Drops, StuckFiles

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


def decision_log(
    directory: Path, clock: VirtualClock, sample_rate: float = 1.0, keep_days: int = 7
) -> DecisionLog:
    # The thread names files by the clock the log stamps lines with: one virtual day.
    files = RecordFiles(directory, DECISION_FILES, keep_days, clock=clock, flush_interval_s=0.01)
    return DecisionLog(files, sample_rate, Drops(), clock=clock)


def record(log: DecisionLog) -> None:
    log.record(outcome())


def test_lines_carry_the_decision_and_usage_never_secrets(tmp_path: Path) -> None:
    clock = VirtualClock(1_790_000_000.0)
    log = decision_log(tmp_path, clock)
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
    for _ in range(4):
        # A sidecar a day: closing writes what is queued, under the day it was queued in.
        log = decision_log(tmp_path, clock, keep_days=2)
        record(log)
        log.close()
        clock.now_s += DAY_S
    files = sorted(p.name for p in tmp_path.glob("decisions-*.jsonl"))
    assert len(files) == 2  # days 3 and 4; days 1 and 2 were older than keep_days


def test_sampling_keeps_about_the_rate(tmp_path: Path) -> None:
    log = decision_log(tmp_path, VirtualClock(1_790_000_000.0), sample_rate=0.1)
    for _ in range(2000):
        record(log)
    log.close()
    (path,) = tmp_path.glob("decisions-*.jsonl")
    assert 120 <= len(path.read_text().splitlines()) <= 280


def test_a_disk_that_hangs_drops_and_counts_and_never_blocks(tmp_path: Path) -> None:
    files = StuckFiles(tmp_path, DECISION_FILES)
    drops = Drops()
    log = DecisionLog(files, 1.0, drops)
    refusal = RateLimited("no", reason="budget_requests")
    log.refused(Seen("r0", ApiKey("ef" * 32, "acme", Tier.STANDARD)), refusal)
    assert files.writing.wait(5)  # the thread holds r0, stuck on its disk
    started = time.perf_counter()
    for i in range(1, 6):
        log.refused(Seen(f"r{i}", ApiKey("ef" * 32, "acme", Tier.STANDARD)), refusal)
    # Not a speed test: a loop that waited on the disk would wait the 10 s release.
    assert time.perf_counter() - started < 5
    assert drops.count == 3  # two fit the queue
    files.release.set()
    log.close()
    (path,) = tmp_path.glob("decisions-*.jsonl")
    assert [json.loads(line)["request_id"] for line in path.read_text().splitlines()] == [
        "r0",
        "r1",
        "r2",
    ]
