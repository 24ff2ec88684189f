"""`slogate loadtest`: a workload file played open-loop against a local stack it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policy import parse_policy
from tooling.loadtest import Shot, report


def test_report_counts_statuses_and_judges_like_the_simulator() -> None:
    policy = parse_policy({"slos": {"critical": {"default": 2000}}})
    shots = [
        Shot("a", "critical", 0.0, stream=True, prompt_tokens=100, max_tokens=10, status=200,
             ttft_s=0.05, latency_s=0.2, completion_tokens=10),
        Shot("a", "critical", 0.1, stream=True, prompt_tokens=100, max_tokens=10, status=200,
             ttft_s=0.3, latency_s=0.4, completion_tokens=10),
        Shot("a", "critical", 0.2, status=429, reason="rate_limited"),
    ]  # fmt: skip
    result = report(shots, policy, time_scale=0.1, workload="w")
    critical = result["tiers"]["critical"]
    assert critical["statuses"] == {"200": 2, "429 rate_limited": 1}
    # At time scale 0.1, 0.3 real seconds are 3 workload seconds: over the 2 s SLO.
    assert critical["slo_attainment"] == 0.5
    assert critical["p99_ttft_s"] == pytest.approx(3.0)
    assert result["tenants"]["a"]["requests"] == 3


@pytest.mark.e2e
def test_a_short_field_mix_against_a_local_stack(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tooling.cli", "loadtest", "--workload", "field-mix",
            "--duration-s", "20", "--time-scale", "0.2", "--out-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "loadtest-field-mix.json").read_text())
    shots = result["shots"]
    assert len(shots) > 50
    assert all(s["status"] for s in shots), "a request got no answer"
    assert result["errors_without_json"] == 0
    assert all(s["reason"] for s in shots if s["status"] != 200)
    assert sum(s["status"] == 200 for s in shots) > len(shots) // 2
    # Open loop: the generator kept to the schedule (real seconds).
    assert result["lag_p99_s"] < 0.1, result["lag_p99_s"]
    assert set(result["tiers"]) == {"critical", "standard", "sheddable"}
    # Nothing held once the clients are done, and every process of the stack was watched.
    assert result["after_drain"] == {
        "inflight_requests": 0,
        "kv_tokens_held": 0,
        "batch_slots_held": 0,
        "reservations_outstanding": 0,
    }
    assert {"sidecar", "envoy", "pool-default"} <= set(result["processes"])
    assert 0 < result["processes"]["sidecar"]["cpu_share"] < 2.0
    assert (tmp_path / "loadtest-field-mix.md").read_text().startswith("# slogate loadtest")
