"""`slogate serve --workers N`'s parts in process: the merged exposition, tracking ids naming
their worker, JSON lines relayed whole, the in-process store refused.

N real worker processes behind one port: tests/e2e/extproc/runtime/test_supervisor.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from extproc.runtime.processes import python_module
from extproc.runtime.supervisor import _Relay
from extproc.runtime.workers import WorkerSlot, merge_expositions
from tests.support.http import metric, parse
from tests.support.workers import write_policy


def test_the_merged_exposition_adds_counts_and_keeps_levels() -> None:
    one = (
        "# TYPE slogate_decisions_total counter\n"
        'slogate_decisions_total{pool="default"} 3\n'
        "# TYPE slogate_breaker_level gauge\n"
        'slogate_breaker_level{pool="default"} 1\n'
        "# TYPE slogate_redis_up gauge\nslogate_redis_up 1\n"
    )
    two = one.replace(" 3\n", " 4\n").replace("} 1\n", "} 3\n").replace("up 1", "up 0")
    merged = parse(merge_expositions([one, two]))
    assert metric(merged, "slogate_decisions_total", pool="default") == 7
    assert metric(merged, "slogate_breaker_level", pool="default") == 3  # the highest, not 4
    assert metric(merged, "slogate_redis_up") == 0  # the lowest: one worker is degraded


def test_a_tracking_id_names_the_worker_that_decided_it() -> None:
    slot = WorkerSlot(1, 3, "ab12", Path("/tmp"))
    assert slot.prefix == "ab121"
    assert slot.owner_of("ab122-1f") == 2 and slot.owner_of("ab121-3") == 1
    assert slot.owner_of("ab129-3") is None  # past the last worker
    assert slot.owner_of("ff00aa-3") is None  # another serve's (a replica's)


def test_more_workers_refuse_the_in_process_store(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", None)
    done = subprocess.run(
        [*python_module("tooling.cli.main", "serve", "--policy", str(policy), "--workers", "2")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "needs budget.store: redis" in done.stderr


def test_json_worker_lines_stay_one_json_object_each(capsys: pytest.CaptureFixture[str]) -> None:
    relay = _Relay(json_lines=True)
    relay.line(1, '{"ts": "t", "level": "INFO", "logger": "slogate.serve", "message": "hi"}')
    relay.line(0, "Traceback (most recent call last):")  # a crash's raw stderr
    relay.line(None, "slogate serve: worker-0 exited with status 1", level="ERROR")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == {
        "ts": "t", "level": "INFO", "logger": "slogate.serve", "message": "hi", "worker": 1
    }  # fmt: skip
    assert lines[1]["worker"] == 0 and lines[1]["message"].startswith("Traceback")
    assert lines[2]["level"] == "ERROR" and "worker" not in lines[2]
