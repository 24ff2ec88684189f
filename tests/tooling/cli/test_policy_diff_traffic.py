"""`slogate policy diff OLD NEW --traffic DIR`: a small record written here (JSON lines,
gzip), replayed under both policies; no processes are started."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from policy.loader import parse_policy
from tests.support.stack import EXAMPLE_POLICY
from tooling.cli.main import main

START_S = 1_790_000_000.0


def _policy(tmp_path: Path, name: str, acme_rpm: int) -> Path:
    raw = yaml.safe_load(EXAMPLE_POLICY.read_text())
    raw["keys"].append(
        {
            "key": "sk-acme",
            "tenant": "acme",
            "tier": "critical",
            "limits": {"requests_per_minute": acme_rpm},
        }
    )
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _record(tmp_path: Path, policy_path: Path) -> Path:
    """A minute of traffic, all admitted when recorded: acme 20 requests in its first 20 s
    (within 20 a minute, not within 10), the demo critical tenant 20 and the demo standard
    tenant 30 over the minute; each streamed, 300 ms to its first token, 1 s in all."""
    policy = parse_policy(yaml.safe_load(policy_path.read_text()))
    senders = {"sk-acme": (1.0, 20), "sk-demo-critical": (3.0, 20), "sk-demo-standard": (2.0, 30)}
    lines: list[dict[str, Any]] = []
    for secret, (every_s, count) in senders.items():
        key = policy.key_for(secret)
        assert key is not None
        for i in range(count):
            lines.append(
                {
                    "v": 1,
                    "t": START_S + i * every_s + 0.01 * len(lines),  # never two at once
                    "id": f"{key.tenant}-{i}",
                    "outcome": "admitted",
                    "key": key.key_id,
                    "tenant": key.tenant,
                    "tier": key.tier.value,
                    "api": "chat_completions",
                    "prompt": 200,
                    "count": "exact",
                    "max_tokens": 64,
                    "stream": True,
                    "pool": "default",
                    "status": 200,
                    "usage_prompt": 200,
                    "usage_completion": 40,
                    "ttft_ms": 300.0,
                    "duration_ms": 1000.0,
                    "settled_ms": 1020.0,
                    "decided_ms": 1.0,
                }
            )
    lines.sort(key=lambda line: line["t"])
    directory = tmp_path / "traffic"
    directory.mkdir()
    body = b"".join(msgspec.json.encode(line) + b"\n" for line in lines)
    (directory / "traffic-2026-09-21-h-1.jsonl.gz").write_bytes(gzip.compress(body))
    return directory


def test_halving_one_tenants_requests_per_minute_shows_only_its_refusals_and_trips_the_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = _policy(tmp_path, "old.yaml", 20), _policy(tmp_path, "new.yaml", 10)
    traffic = _record(tmp_path, old)
    out = tmp_path / "diff"
    code = main(
        ["policy", "diff", str(old), str(new), "--traffic", str(traffic), "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "guard tripped: critical tenant acme loses" in captured.err
    report = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["tenant"], r["tier"]): r for r in report["rows"]}
    acme = rows[("acme", "critical")]
    assert report["rows"][0]["tenant"] == "acme"  # the changed first
    assert acme["old"]["admitted"] == 20 and acme["old"]["refused"] == {}
    assert acme["new"]["admitted"] < 20
    assert acme["new"]["refused"] == {"budget_requests": 20 - acme["new"]["admitted"]}
    assert acme["requests_with_another_fate"] == 20 - acme["new"]["admitted"]
    # The same arrivals in both replays: nobody else's outcomes move at all.
    for key, row in rows.items():
        if key != ("acme", "critical"):
            assert not row["changed"] and row["old"] == row["new"], row
            assert row["requests_with_another_fate"] == 0
    assert set(rows) == {
        ("acme", "critical"),
        ("demo-critical", "critical"),
        ("demo-standard", "standard"),
    }
    assert [t["guard"] for t in report["guards"]["tripped"]] == ["max_critical_loss"]
    assert any("requests_per_minute 20 → 10" in sentence for sentence in report["schema"])
    markdown = out.with_suffix(".md").read_text()
    assert markdown == captured.out
    assert "1 tenant/tier row(s) change:" in markdown
    assert "| acme | critical | 20 | 20 → " in markdown
    assert "<summary>2 row(s) unchanged</summary>" in markdown

    # A looser guard lets the same change through; the same policy twice changes nothing.
    looser = ["--max-critical-loss", "0.6"]
    assert main(["policy", "diff", str(old), str(new), "--traffic", str(traffic), *looser]) == 0
    assert main(["policy", "diff", str(old), str(old), "--traffic", str(traffic)]) == 0
    assert "No tenant's outcomes change." in capsys.readouterr().out
    simulated = ["--traffic", str(traffic), "--simulated-timing"]
    assert main(["policy", "diff", str(old), str(old), *simulated]) == 0
    assert "No tenant's outcomes change." in capsys.readouterr().out


def test_no_record_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _policy(tmp_path, "old.yaml", 20)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["policy", "diff", str(old), str(old), "--traffic", str(empty)]) == 2
    assert "no traffic record files found" in capsys.readouterr().err


def test_the_p99_guard_names_the_tenant_and_how_much() -> None:
    from sim.fleet.replay import ReplayedRequest, ReplayedRequests
    from sim.studies.policy_impact import Guards, check_guards, compare

    def run(ttft_s: float) -> ReplayedRequests:
        slow = [
            ReplayedRequest(i, "b", "standard", "admitted", "", "default", ttft_s, True, 9)
            for i in range(10)
        ]
        fast = [
            ReplayedRequest(10 + i, "a", "standard", "admitted", "", "default", 0.5, True, 9)
            for i in range(10)
        ]
        return ReplayedRequests(slow + fast, 10.0)

    rows = compare(run(1.0), run(1.3))
    assert [(r["tenant"], r["changed"]) for r in rows] == [("b", True), ("a", False)]
    tripped = check_guards(rows, Guards())
    assert [(t["guard"], t["tenant"]) for t in tripped] == [("max_p99_growth", "b")]
    assert "P99 TTFT 1.0 s → 1.3 s (+30.0%; at most +20%)" in tripped[0]["message"]
    assert check_guards(rows, Guards(max_p99_growth=0.5)) == []


def test_a_tenant_moved_to_another_tier_moves_its_requests_between_rows() -> None:
    from sim.fleet.replay import ReplayedRequest, ReplayedRequests
    from sim.studies.policy_impact import Guards, check_guards, compare

    def run(tier: str) -> ReplayedRequests:
        return ReplayedRequests(
            [
                ReplayedRequest(i, "a", tier, "admitted", "", "default", 0.2, True, 5)
                for i in range(4)
            ],
            4.0,
        )

    rows = {(r["tenant"], r["tier"]): r for r in compare(run("critical"), run("standard"))}
    assert rows[("a", "critical")]["old"]["admitted"] == 4
    assert rows[("a", "critical")]["new"]["requests"] == 0
    assert rows[("a", "standard")]["new"]["admitted"] == 4
    assert all(r["requests_with_another_fate"] == 4 for r in rows.values())
    assert check_guards(list(rows.values()), Guards()) == []  # still admitted: nothing lost
