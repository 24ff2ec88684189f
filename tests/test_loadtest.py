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
def test_the_smoke_scenario_keeps_its_invariants(tmp_path: Path) -> None:
    """sim/workloads/smoke.yaml, 100 s at time scale 0.2 (20 s of arrivals): a steady mix,
    a 10x burst, crafted prompts, the default pool slowed and then failing 30%, the
    sidecar SIGKILLed and restarted. Invariants, not timings."""
    done = subprocess.run(
        [
            sys.executable, "-m", "tooling.cli", "loadtest", "--workload", "smoke",
            "--time-scale", "0.2", "--out-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "loadtest-smoke.json").read_text())
    shots = result["shots"]
    assert len(shots) > 300
    assert [w["fault"].split(":")[0] for w in result["faults"]] == [
        "pool default",
        "SIGKILL sidecar at 62 s",
        "pool default",
    ]
    # Every request answered, every error an OpenAI JSON error with a code.
    assert all(s["status"] for s in shots), "a request got no answer"
    assert result["errors_without_json"] == 0
    assert all(s["error_code"] for s in shots if s["status"] != 200)
    # No 5xx but those the faults inject or the failure mode documents (closed: 502).
    assert all(s["during_fault"] for s in shots if s["status"] >= 500)
    for tier in result["tiers"].values():
        assert tier["server_errors_outside_faults"] == 0
    assert any(s["status"] == 502 and s["during_fault"] for s in shots)  # the kill was seen
    assert result["tiers"]["critical"]["slo_attainment_outside_faults"] >= 0.99
    # Nothing held once the clients are done; the restarted sidecar was watched too.
    assert result["after_drain"] == {
        "inflight_requests": 0,
        "kv_tokens_held": 0,
        "batch_slots_held": 0,
        "reservations_outstanding": 0,
    }
    assert {"sidecar", "sidecar-restart1", "envoy", "pool-default"} <= set(result["processes"])
    # The engines and the breaker were watched over the run.
    pools = result["signals"]["pools"]
    assert set(pools) == {"default", "long", "fallback"} and pools["default"]["running_max"] >= 1
    assert "default" in result["signals"]["breakers"] and len(result["timeline"]) >= 10
    # Open loop: the generator kept to the schedule (real seconds).
    assert result["lag_p99_s"] < 0.1, result["lag_p99_s"]
    assert (tmp_path / "loadtest-smoke.md").read_text().startswith("# slogate loadtest")
