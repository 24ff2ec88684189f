"""The overhead benchmark's py-spy summary: each sample given to one part of the path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from extproc.request.contract import FORWARDED_NAMESPACE
from policy._data_path import ExtProcMessages
from tooling.benchmarks.overhead import POLICY, front_policy, setups_for
from tooling.benchmarks.profile import OTHER, summarise
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.one_message import FORWARD_FILTER, HOLD_FILTER
from tooling.render.envoy_config.profile import EnvoyPorts, FilterProfile
from tooling.stack.processes import envoy_binary

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
    split = ("slogate_uncounted", "passthrough_one_message")
    assert setups_for("small") == ("envoy_alone", "passthrough", "slogate", *split)
    assert setups_for("field_mix") == ("passthrough", "slogate", *split)
    assert setups_for("multi_turn") == ("passthrough", "slogate")
    # A lever is one more slogate beside the others.
    assert setups_for("field_mix", ["no_split"]) == (
        "passthrough",
        "slogate",
        *split,
        "slogate+no_split",
    )
    assert setups_for("1k", ["no_split"]) == ("passthrough", "slogate", "slogate+no_split")


def test_the_one_message_arm_runs_the_products_one_message_mode(tmp_path: Path) -> None:
    """`passthrough_one_message` is the product's `data_path.messages: one` bootstrap
    (tooling.render.envoy_config.one_message): headers skipped and forwarded as metadata, a buffer
    holding the request; Envoy 1.40 validates it."""
    policy = front_policy(POLICY, 18083, single_message=True)
    config = build_bootstrap(
        policy, EnvoyPorts(18080, 18081, 18082, "127.0.0.1"), FilterProfile.EXT_PROC_ONLY
    )
    manager = config["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]
    names = [f["name"] for f in manager["typedConfig"]["httpFilters"]]
    assert names[-4:] == [
        FORWARD_FILTER,
        "slogate.ext_proc",
        HOLD_FILTER,
        "envoy.filters.http.router",
    ]
    processor = manager["typedConfig"]["httpFilters"][names.index("slogate.ext_proc")]
    assert processor["typedConfig"]["processingMode"]["requestHeaderMode"] == "SKIP"
    forwarded = processor["typedConfig"]["metadataOptions"]["forwardingNamespaces"]
    assert forwarded == {"untyped": [FORWARDED_NAMESPACE]}
    assert front_policy(POLICY, 18083).data_path.messages is ExtProcMessages.TWO
    path = tmp_path / "one.json"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
