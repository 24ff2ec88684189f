"""The traffic record: written off the loop, read back file:line-checked, replayed offline."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from admission.decision import CandidateNote, CountKind, RequestOutcome, RoutingDecision
from admission.errors import RateLimited
from extproc.service.record_files import RecordFiles
from extproc.service.traffic_read import CandidateVerdict, TrafficEntry, read_traffic
from extproc.service.traffic_record import TRAFFIC_FILES, TrafficRecorder
from policy._reader import PolicyError
from policy.domain import ApiKey, ContextBucket, Tier
from policy.loader import load_policy, parse_policy
from sim.fleet.replay import replay
from tests.support.clock import VirtualClock
from tests.support.decisions import Seen
from tests.support.record_writers import Drops, StuckFiles
from tests.support.stack import EXAMPLE_POLICY

SECRET = "sk-very-secret"
DAY_S = 86_400.0


def decision(request_id: str = "req-1") -> RoutingDecision:
    return RoutingDecision(
        request_id=request_id,
        caller=ApiKey("ef" * 32, "acme", Tier.STANDARD),
        pool="default",
        bucket=ContextBucket("0-4k", 0, 4096, 1.0),
        prompt_tokens=120,
        max_tokens=64,
        estimate=CountKind.CACHED,
        stream=True,
    )


def test_records_carry_shapes_and_outcomes_never_secrets(tmp_path: Path) -> None:
    recorder = TrafficRecorder(RecordFiles(tmp_path, TRAFFIC_FILES, keep_days=7), 1.0, Drops())
    recorder.admitted("t1", 1_790_000_000.0)
    recorder.record(RequestOutcome(decision(), "t1", 200, 110, 40, 0.25, 1.5, "via_upstream"))
    refusal = RateLimited(f"limit for {SECRET}", reason="budget_tokens")
    recorder.refused(Seen("req-2", decision().caller, decision("req-2"), 1_790_000_001.0), refusal)
    recorder.refused(Seen("req-3", arrived_s=1_790_000_002.0), refusal)
    recorder.close()
    (path,) = tmp_path.glob("traffic-*.jsonl.gz")
    text = gzip.decompress(path.read_bytes()).decode()
    assert SECRET not in text and "ef" * 32 not in text  # reasons only, key ids only
    read = read_traffic([tmp_path])
    assert read.problems == []
    admitted, refused, unknown = read.entries
    assert admitted.t == 1_790_000_000.0 and admitted.key == "ef" * 6
    assert (admitted.prompt, admitted.count, admitted.max_tokens, admitted.n) == (
        120,
        "cached",
        64,
        1,
    )
    assert (admitted.usage_completion, admitted.ttft_ms, admitted.stream) == (40, 250.0, True)
    assert admitted.verdict == "admitted"
    assert refused.verdict == "refused:budget_tokens" and refused.prompt == 120
    assert unknown.prompt is None and unknown.key is None


def test_a_candidate_s_verdict_is_recorded_beside_the_outcome(tmp_path: Path) -> None:
    """Shadow mode: what the candidate would have done travels in the record (admitted
    and refused alike); without a candidate the field is absent."""
    recorder = TrafficRecorder(RecordFiles(tmp_path, TRAFFIC_FILES, keep_days=7), 1.0, Drops())
    judged = dataclasses.replace(
        decision(), candidate=CandidateNote("would_refuse", "budget_requests", "default")
    )
    recorder.admitted("t1", 1_790_000_000.0)
    recorder.record(RequestOutcome(judged, "t1", 200, 110, 40, 0.2, 1.0, "ok"))
    shape = dataclasses.replace(decision("r2"), candidate=CandidateNote("would_admit", "", "long"))
    refusal = RateLimited("no", reason="budget_tokens")
    recorder.refused(Seen("r2", None, shape, 1_790_000_001.0), refusal)
    recorder.refused(Seen("r3", None, decision("r3"), 2e9), refusal)
    recorder.close()
    admitted, refused, plain = read_traffic([tmp_path]).entries
    assert admitted.candidate == CandidateVerdict("would_refuse", "budget_requests", "default")
    assert refused.candidate == CandidateVerdict("would_admit", "", "long")
    assert plain.candidate is None


def test_old_days_are_deleted_by_the_injected_clock(tmp_path: Path) -> None:
    clock = VirtualClock(dt.datetime(2026, 3, 10, 12, tzinfo=dt.UTC).timestamp())
    for day in ("2026-03-01", "2026-03-03", "2026-03-04", "2026-03-09"):
        (tmp_path / f"traffic-{day}-other-1.jsonl.gz").write_bytes(gzip.compress(b""))
    (tmp_path / "notes.txt").write_text("kept")
    files = RecordFiles(tmp_path, TRAFFIC_FILES, keep_days=7, clock=clock, flush_interval_s=0.01)
    files.queue.put({"v": 1, "t": clock(), "outcome": "admitted"})
    files.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n[8:18] for n in names if n.startswith("traffic-")] == [
        "2026-03-04",
        "2026-03-09",
        "2026-03-10",
    ]
    assert "notes.txt" in names


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path: Path) -> None:
    files = StuckFiles(tmp_path, TRAFFIC_FILES)
    drops = Drops()
    recorder = TrafficRecorder(files, 1.0, drops)
    refusal = RateLimited("no", reason="budget_requests")
    recorder.refused(Seen("r0", arrived_s=1.0), refusal)
    assert files.writing.wait(5)  # the thread holds r0, stuck on its disk
    started = time.perf_counter()
    for i in range(1, 6):
        recorder.refused(Seen(f"r{i}", arrived_s=1.0 + i), refusal)
    assert time.perf_counter() - started < 0.05
    assert drops.count == 3  # two fit the queue
    files.release.set()
    recorder.close()
    assert [e.id for e in read_traffic([tmp_path]).entries] == ["r0", "r1", "r2"]


def _line(**fields: Any) -> bytes:
    return msgspec.json.encode({"v": 1, "outcome": "admitted", **fields}) + b"\n"


def test_bad_lines_and_a_truncated_file_name_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "traffic-2026-03-10-a-1.jsonl.gz"
    body = _line(t=1.0, id="a1") + b"{not json\n" + _line(t=2.0, prompt="many", id="a3")
    body += _line(t=3.0, v=9, id="a4") + _line(t=4.0, outcome="refused", id="a5")
    good.write_bytes(gzip.compress(body) + gzip.compress(_line(t=5.0, id="a6")))
    cut = tmp_path / "traffic-2026-03-10-b-2.jsonl.gz"
    whole = gzip.compress(_line(t=1.5, id="b1")) + gzip.compress(
        b"".join(_line(t=6.0 + i, id=f"b{i + 2}") for i in range(200))
    )
    cut.write_bytes(whole[: len(whole) - 40])
    read = read_traffic([tmp_path])
    problems = "\n".join(read.problems)
    assert f"{good}:2: JSON is malformed" in problems
    assert f"{good}:3: Expected `int | null`, got `str` - at `$.prompt`" in problems
    assert f"{good}:4: record version 9" in problems
    assert f"{good}:5: a refusal without its reason" in problems
    assert f"{cut}:" in problems and "compressed data broken off or corrupt" in problems
    ids = [e.id for e in read.entries]
    assert ids[:3] == ["a1", "b1", "a6"] and "b2" in ids  # the rest, merged by time


def test_a_bad_section_is_an_error_with_its_path() -> None:
    raw = {"traffic_record": {"dir": "/tmp/x", "sample_rat": 1.0}}
    with pytest.raises(PolicyError, match=r"traffic_record\.sample_rat"):
        parse_policy(raw)
    assert parse_policy({"traffic_record": {"dir": "/x"}}).traffic_record is not None


def test_replay_reproduces_a_small_keys_refusals() -> None:
    """sk-demo-small: 5 requests a minute. Twelve in ten seconds: five admitted, seven
    refused for its requests, and the replay under the same policy says the same."""
    policy = load_policy(EXAMPLE_POLICY)
    key = policy.key_for("sk-demo-small")
    assert key is not None
    entries = [
        TrafficEntry(
            v=1,
            t=1_790_000_000.0 + i * 0.8,
            id=f"q{i}",
            outcome="admitted" if i < 5 else "refused",
            reason=None if i < 5 else "budget_requests",
            key=key.key_id,
            tenant=key.tenant,
            prompt=30,
            count="exact",
            max_tokens=16,
            stream=True,
            usage_prompt=30,
            usage_completion=12,
        )
        for i in range(12)
    ]
    report = replay(entries, policy)
    assert report["agreement"]["agreement"] == 1.0, report["agreement"]
    assert report["agreement"]["recorded"] == {"refused:budget_requests": 7, "admitted": 5}


def test_the_replay_command_names_bad_lines_and_replays_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tooling.cli.main import main

    key = load_policy(EXAMPLE_POLICY).key_for("sk-demo-standard")
    assert key is not None
    fields = {"key": key.key_id, "prompt": 40, "count": "exact", "max_tokens": 8}
    body = b"".join(_line(t=1_790_000_000.0 + i, id=f"q{i}", **fields) for i in range(5))
    path = tmp_path / "traffic" / "traffic-2026-09-21-h-1.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(body + b'{"v": 1, "t": \n') + gzip.compress(body)[:-12])
    out = tmp_path / "replay"
    policy = str(EXAMPLE_POLICY)
    code = main(["replay", "--traffic", str(path.parent), "--policy", policy, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"{path}:6: Input data was truncated" in err
    assert f"{path}:11: compressed data broken off or corrupt" in err  # 7-10 read
    report = msgspec.json.decode(out.with_suffix(".json").read_bytes())
    assert report["agreement"]["replayed"] >= 5 and report["agreement"]["agreement"] == 1.0


def test_replay_holds_budgets_for_as_long_as_the_real_requests_did() -> None:
    """Two at once for this key: requests that really ran 5 s keep the third out in the
    replay too; played by the simulated engines instead (done in well under a second), the
    third would be admitted."""
    import yaml

    raw = yaml.safe_load(EXAMPLE_POLICY.read_text())
    raw["keys"].append(
        {"key": "sk-two", "tenant": "two", "tier": "standard", "limits": {"concurrent_requests": 2}}
    )
    policy = parse_policy(raw)
    key = policy.key_for("sk-two")
    assert key is not None

    def entry(at_s: float, refused: bool) -> TrafficEntry:
        return TrafficEntry(
            v=1,
            t=1_790_000_000.0 + at_s,
            outcome="refused" if refused else "admitted",
            reason="budget_concurrency" if refused else None,
            key=key.key_id,
            prompt=30,
            count="exact",
            max_tokens=8,
            status=429 if refused else 200,
            usage_prompt=30,
            usage_completion=8,
            ttft_ms=None if refused else 4000.0,
            duration_ms=None if refused else 5000.0,
            settled_ms=None if refused else 5100.0,
            decided_ms=2.0,
        )

    entries = [entry(0.0, False), entry(0.1, False), entry(1.0, True), entry(6.0, False)]
    assert replay(entries, policy)["agreement"]["agreement"] == 1.0
    simulated = replay(entries, policy, recorded_timing=False)["agreement"]
    assert simulated["disagreements"] == {
        "recorded refused:budget_concurrency -> replayed admitted": 1
    }
