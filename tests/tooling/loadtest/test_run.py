"""`slogate loadtest`: the measures, the report, the predictions and the capacity search.

The smoke scenario played against a local stack: tests/e2e/tooling/loadtest/test_run.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from policy.domain import Limits
from policy.loader import parse_policy
from sim.fleet.workload_files import SIMULATION_POLICY, WORKLOADS, load_workload, workload_policy
from tooling.loadtest.predict import (
    capacity,
    capacity_limit,
    capacity_table,
    predict,
    prediction_errors,
    under,
)
from tooling.loadtest.report import compare_table, report, table
from tooling.loadtest.run import unprotected_policy
from tooling.loadtest.shots import Shot
from tooling.stack.processes import process_table, tree_usage


def test_a_process_is_measured_with_its_children_but_not_with_other_measured_ones() -> None:
    """A real vLLM does its model's work in a child (the engine core): a parent's CPU and
    RSS include its children's, except children that are measured under their own name."""
    # The child says when it has spun its 0.6 s of CPU (on the parent's stdout, which it
    # inherits): on a loaded machine that takes longer than any fixed sleep one would pick.
    spin = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
        "print('spun', flush=True)\ntime.sleep(30)\n"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {spin!r}])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert parent.stdout.readline() == b"spun\n"
        table = process_table()
        alone = table[parent.pid][1]
        whole = tree_usage(parent.pid, table)
        without = tree_usage(parent.pid, table, others={child_pid})
        assert whole is not None and without is not None
        assert whole[0] >= alone + 0.5  # the child's spin counted in the parent's tree
        assert without[0] == pytest.approx(alone)
        assert whole[1] > without[1] > 0  # RSS too
        assert tree_usage(2**22 + 7, table) is None
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the group: the child too
        parent.wait()


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
    # As the simulator counts them: a refusal misses its SLO; goodput only within it.
    assert critical["slo_attainment_of_all"] == pytest.approx(1 / 3)
    timed = report(shots, policy, time_scale=0.1, workload="w", duration_s=10.0)
    assert timed["tiers"]["critical"]["goodput_tokens_per_s"] == pytest.approx(1.0)


def test_requests_measured_through_the_generators_own_stall_are_counted_apart() -> None:
    policy = parse_policy({"slos": {"critical": {"default": 2000}}})
    on_time = dict(stream=True, prompt_tokens=100, max_tokens=10, completion_tokens=10)
    shots = [
        Shot("a", "critical", 0.0, status=200, ttft_s=0.05, latency_s=0.2, **on_time),
        # Its first token stamped after the generator's 3 s stall: not the stack's time.
        Shot("a", "critical", 1.0, status=200, ttft_s=3.2, latency_s=3.3, generator_held=True,
             **on_time),
        # Sent 5 s late into what a fault left behind: not the workload's request either.
        Shot("a", "critical", 1.1, lag_s=5.0, status=503, reason="shed_tier_shed",
             generator_held=True),
        Shot("a", "critical", 2.0, status=502, during_fault=True, generator_held=True),
    ]  # fmt: skip
    result = report(shots, policy, time_scale=1.0, workload="w", stalls=[(1.0, 4.0)])
    critical = result["tiers"]["critical"]
    assert critical["slo_attainment_outside_faults"] == 1.0  # the held one is not judged
    assert critical["slo_attainment"] == 0.5  # but the plain attainment keeps it
    assert critical["server_errors_outside_faults"] == 0
    assert critical["generator_held"] == 2  # outside faults, set aside
    assert result["generator_stalls"] == [{"from_s": 1.0, "to_s": 4.0}]
    assert "the load generator itself stalled (real 1.0-4.0 s)" in table(result)


def test_each_pool_that_answered_is_counted_with_its_5xx() -> None:
    policy = parse_policy({})
    shots = [
        Shot("a", "critical", 0.0, status=200, pool="long"),
        Shot("a", "critical", 0.1, status=500, pool="long"),  # the engine's: no slogate reason
        Shot("a", "critical", 0.2, status=503, pool="default"),
        Shot("a", "critical", 0.3, status=503, reason="shed_tier_shed"),  # no pool named
        # slogate's refusal, named after the route Envoy had picked before the decision
        Shot("a", "critical", 0.4, status=503, reason="shed_long_context_shed", pool="default"),
    ]
    pools = report(shots, policy, time_scale=1.0, workload="w")["pools"]
    assert pools == {
        "default": {"requests": 1, "served": 0, "server_errors": 1},
        "long": {"requests": 2, "served": 1, "server_errors": 1},
    }


def test_burst_handling_counts_the_burst_tenants_requests_in_the_windows() -> None:
    policy = parse_policy({"slos": {"standard": {"default": 4000}}})
    shots = [  # scheduled at 0.1 x workload seconds 5, 15, 16, 17
        Shot("launch", "standard", 0.5, status=200, ttft_s=0.01, completion_tokens=1),
        Shot("launch", "standard", 1.5, status=200, ttft_s=0.01, completion_tokens=1),
        Shot("launch", "standard", 1.6, status=503, reason="shed_tier_shed"),
        Shot("other", "standard", 1.7, status=503, reason="shed_tier_shed"),
    ]
    result = report(
        shots, policy, 0.1, "w", bursts=[(10.0, 20.0)], burst_tenants=frozenset({"launch"})
    )
    assert result["burst_handling"] == 0.5


def test_unprotected_is_the_same_policy_with_admission_off() -> None:
    protected = workload_policy(WORKLOADS / "burst-10x.yaml", SIMULATION_POLICY)
    raw = unprotected_policy(protected)
    policy = parse_policy(raw)  # still a valid policy
    assert all(not k.get("limits") for k in raw["keys"]) and protected["keys"][0]["limits"]
    assert policy.breaker.controller_enabled is False and policy.waiting_room.enabled is False
    assert policy.breaker.thresholds.l1_p99_over_slo >= 1e9
    assert policy.breaker.thresholds.l1_kv_cache >= 1e9
    assert parse_policy(protected).slo_ttft_p99_ms == policy.slo_ttft_p99_ms  # same objectives
    assert protected["breaker"]["thresholds"].get("l1_kv_cache") is None  # not changed


def test_the_comparison_puts_the_modes_side_by_side() -> None:
    policy = parse_policy({"slos": {"critical": {"default": 2000}}})
    ok = Shot("a", "critical", 0.0, status=200, ttft_s=0.05, latency_s=0.1, completion_tokens=5)
    failed = Shot("a", "critical", 0.0, status=503, reason="")
    runs = {
        "protected": report([ok], policy, 1.0, "w", duration_s=1.0),
        "unprotected": report([ok, failed], policy, 1.0, "w", duration_s=1.0),
    }
    text = compare_table(runs)
    assert "| who | metric | protected | unprotected |" in text
    assert "| tier critical | 5xx or no answer | 0 | 1 |" in text


def test_the_simulator_predicts_what_a_live_run_measures_and_the_error_is_reported() -> None:
    workload = load_workload(WORKLOADS / "smoke.yaml", SIMULATION_POLICY).first(30.0)
    predicted = predict(workload, seed=1)
    assert set(predicted["tiers"]) == {"critical", "standard", "sheddable"}
    assert predicted["goodput_tokens_per_s"] > 0
    shots = [
        Shot(a.key.tenant, a.key.tier.value, a.at_s, stream=a.stream, prompt_tokens=a.prompt_tokens,
             max_tokens=a.max_tokens, status=200, ttft_s=0.5, latency_s=1.0,
             completion_tokens=a.max_tokens)
        for a in workload.arrivals
    ]  # fmt: skip
    live = report(shots, workload.policy, 1.0, workload.name, duration_s=workload.duration_s)
    errors = prediction_errors(live, predicted)
    row = errors["critical p99_stream_ttft_s"]  # the smoke mix is half streams
    expected = predicted["tiers"]["critical"]["p99_stream_ttft_s"]
    assert row["live"] == pytest.approx(0.5) and row["predicted"] == expected
    assert row["error"] == pytest.approx(0.5 / row["predicted"] - 1, abs=1e-3)
    # The unprotected run is predicted under its own policy: its keys have no budgets.
    raw = unprotected_policy(workload_policy(WORKLOADS / "smoke.yaml", SIMULATION_POLICY))
    assert any(a.key.limits.concurrent_requests for a in workload.arrivals)
    assert all(a.key.limits == Limits() for a in under(workload, raw).arrivals)


def test_capacity_is_the_highest_multiple_every_tier_keeps_its_attainment() -> None:
    def row(factor: float, *attained: float) -> dict[str, object]:
        tiers = dict(zip(("critical", "standard", "sheddable"), attained, strict=True))
        return {
            "factor": factor,
            "tiers": {t: {"slo_attainment_of_all": a} for t, a in tiers.items()},
        }

    rows = [row(1.0, 1, 1, 1), row(1.5, 1, 0.995, 0.98), row(1.25, 1, 1, 0.993), row(2, 1, 1, 1)]
    # 2x meeting it again does not count: past the first miss, the fleet is over its knee.
    assert capacity_limit(rows) == 1.25
    assert capacity_limit([row(1.0, 0.9, 1, 1)]) is None


def test_capacity_plays_the_workload_at_each_multiple_of_its_rates() -> None:
    rows = capacity(WORKLOADS / "field-mix.yaml", SIMULATION_POLICY, [0.5, 2.0], duration_s=60)
    low, high = rows
    assert 3.0 < high["requests"] / low["requests"] < 5.0  # Poisson draws around 4x
    assert high["goodput_tokens_per_s"] > low["goodput_tokens_per_s"]
    assert capacity_table(rows).count("\n") == 3  # header, rule, two rows


def test_a_scale_that_is_not_above_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from tooling.cli.main import main

    assert main(["loadtest", "--workload", "smoke", "--scale", "0"]) == 2
    assert "--scale must be above 0" in capsys.readouterr().err


def test_the_vllm_policy_waits_by_the_engines_calibrated_prefill_not_half_the_slo() -> None:
    from policy.domain import Tier
    from tooling.loadtest.run import VLLM_POLICY

    path = WORKLOADS / "vllm-burst.yaml"
    policy = parse_policy(workload_policy(path, {**SIMULATION_POLICY, **VLLM_POLICY}))
    # A 1,500-token prompt: ~107 ms of expected prefill leaves most of each SLO to wait in.
    critical = policy.max_wait_s(Tier.CRITICAL, "default", "0-4k", 1500)
    standard = policy.max_wait_s(Tier.STANDARD, "default", "0-4k", 1500)
    assert 1.0 < critical < 2.0 and 0.5 < standard < 1.0
    unprotected = parse_policy(unprotected_policy(workload_policy(path, VLLM_POLICY)))
    assert unprotected.max_wait_s(Tier.CRITICAL, "default", "0-4k", 1500) == 0.0
