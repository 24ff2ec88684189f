"""The overhead benchmark's py-spy summary: each sample given to one part of the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tooling.benchmarks.overhead import setups_for
from tooling.benchmarks.profile import OTHER, summarise

SITE = "/venv/lib/python3.11/site-packages"
REPO = "/src/slogate"


def test_samples_go_to_the_first_part_their_stack_passes_through(tmp_path: Path) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text(
        # A count in a worker thread is counting, not the thread pool.
        f"_bootstrap (/usr/lib/python3.11/threading.py:1002);run (/usr/lib/python3.11/"
        f"concurrent/futures/thread.py:58);count ({REPO}/extproc/request/tokens/bpe.py:120) 60\n"
        # A metric observed from the service is metrics, not the service.
        f"Process ({REPO}/extproc/service/ext_proc.py:80);observe ({SITE}/prometheus_client/"
        "metrics.py:600) 10\n"
        f"_run_once (/usr/lib/python3.11/asyncio/base_events.py:1900);_read ({SITE}/grpc/aio/"
        "_call.py:300) 20\n"
        "<module> (bench.py:1) 10\n"
        "not a sample line\n"
    )
    got = summarise(raw)
    assert got["samples"] == 100
    parts = got["parts"]
    assert isinstance(parts, dict)
    assert parts == {
        "prompt counting (BPE)": 0.6,
        "grpc.aio / cygrpc": 0.2,
        "metrics (prometheus_client)": 0.1,
        OTHER: 0.1,
    }
    assert sum(parts.values()) == pytest.approx(1.0)
    leaves = got["leaves"]
    assert isinstance(leaves, dict)
    # Paths cut to the package, so a profile reads the same on any checkout.
    assert next(iter(leaves)) == "count (extproc/request/tokens/bpe.py:120)"
    assert "observe (prometheus_client/metrics.py:600)" in leaves


def test_an_empty_profile_has_no_shares(tmp_path: Path) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text("")
    assert summarise(raw) == {"samples": 0, "parts": {}, "leaves": {}}


def test_each_profile_compares_with_the_pass_through_and_some_split_the_cost() -> None:
    assert setups_for("small") == ("envoy_alone", "passthrough", "slogate", "slogate_uncounted")
    assert setups_for("field_mix") == ("passthrough", "slogate", "slogate_uncounted")
    assert setups_for("multi_turn") == ("passthrough", "slogate")
    # A lever is one more slogate beside the others (the uncounted split is left out).
    assert setups_for("field_mix", ["no_split"]) == ("passthrough", "slogate", "slogate+no_split")
