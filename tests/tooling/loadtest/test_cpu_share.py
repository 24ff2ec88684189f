"""The CPU share per process in a live run's report: the arithmetic (tooling.loadtest.cpu_share)
and the table the report prints from it."""

from __future__ import annotations

import pytest

from policy.loader import parse_policy
from tooling.loadtest.cpu_share import IDLE, OTHERS, cpu_shares
from tooling.loadtest.report import compare_table, report
from tooling.loadtest.scrape import ProcessSampler
from tooling.loadtest.shots import Shot
from tooling.stack.processes import MachineReading, read_machine


def test_each_process_gets_its_cores_and_the_rest_of_the_machine_is_others_and_idle() -> None:
    # 100 wall seconds on 2 cores: the machine's total grows by 200 CPU seconds, 150 busy.
    shares = cpu_shares(
        {"vllm": (10.0, 70.0), "sidecar": (1.0, 11.0)},
        (MachineReading(1000.0, 5000.0, 1.0), MachineReading(1150.0, 5200.0, 3.0)),
        wall_s=100.0,
        cores=2,
        loads=[1.0, 3.0, 5.0],
    )
    rows = shares["rows"]
    assert rows["vllm"] == {"cpu_s": 60.0, "cores": pytest.approx(0.6), "share": 0.3}
    assert rows["sidecar"]["cores"] == pytest.approx(0.1)
    # Busy 150 s, ours 70 s: everyone else took 80 s (0.8 of a core), 50 s went unused.
    assert rows[OTHERS]["cpu_s"] == pytest.approx(80.0)
    assert rows[OTHERS]["cores"] == pytest.approx(0.8)
    assert rows[OTHERS]["share"] == pytest.approx(0.4)
    assert rows[IDLE]["share"] == pytest.approx(0.25)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert (shares["load1_mean"], shares["load1_max"]) == (3.0, 5.0)


def test_without_the_machines_readings_only_the_processes_are_shared_out() -> None:
    shares = cpu_shares({"envoy": (0.0, 5.0)}, None, wall_s=10.0, cores=2)
    assert set(shares["rows"]) == {"envoy"} and shares["load1_mean"] is None
    assert shares["rows"]["envoy"]["share"] == pytest.approx(0.25)


def test_the_machine_is_read_from_proc() -> None:
    reading = read_machine()
    assert reading is not None and 0 < reading.busy_s < reading.total_s and reading.load1 >= 0


def test_the_report_says_why_a_tier_missed_and_what_each_process_got() -> None:
    policy = parse_policy({"slos": {"critical": {"default": 2000}}})
    kw = dict(stream=True, prompt_tokens=100, max_tokens=10, completion_tokens=10)
    shots = [
        Shot("a", "critical", 0.0, status=200, headers_s=0.01, ttft_s=0.1, **kw),
        # Late by 1.5 s: 0.5 s to the headers, 3.0 s more to its first token.
        Shot("a", "critical", 1.0, status=200, headers_s=0.5, ttft_s=3.5, **kw),
        Shot("a", "critical", 2.0, status=429, reason="budget_concurrency"),
        Shot("a", "critical", 3.0, status=503, reason="queue_timeout"),
    ]  # fmt: skip
    cpu = cpu_shares({"vllm-default": (0.0, 12.0)}, None, wall_s=10.0, cores=2)
    result = report(shots, policy, 1.0, "w", cpu=cpu)
    misses = result["misses"]["critical"]
    assert misses["refused"] == {"429 budget_concurrency": 1}
    assert misses["failed"] == {"503 queue_timeout": 1}
    assert misses["late"] == 1
    assert misses["late_over_objective_p50_s"] == pytest.approx(1.5)
    assert misses["late_to_headers_p50_s"] == pytest.approx(0.5)
    assert misses["late_headers_to_first_token_p50_s"] == pytest.approx(3.0)
    text = compare_table({"protected": result, "unprotected": result})
    assert "| vllm-default | 1.20 (60%) | 1.20 (60%) |" in text
    assert "protected: critical's misses: refused 429 budget_concurrency: 1" in text


def test_the_sampler_shares_out_each_process_from_its_first_to_its_last_sample() -> None:
    sampler = ProcessSampler(dict)
    # (CPU seconds, RSS MiB) per name; "sidecar" restarted with a new name half-way.
    sampler.samples = [
        (0.0, {"vllm": (5.0, 100.0), "sidecar": (1.0, 50.0)}),
        (5.0, {"vllm": (8.0, 100.0), "sidecar-restart1": (0.0, 50.0)}),
        (10.0, {"vllm": (15.0, 100.0), "sidecar-restart1": (0.5, 50.0)}),
    ]
    sampler.machine = [MachineReading(0.0, 0.0, 2.0), MachineReading(16.0, 20.0, 4.0)]
    cpu = sampler.cpu()
    assert cpu is not None and cpu["wall_s"] == 10.0
    assert cpu["rows"]["vllm"]["cores"] == pytest.approx(1.0)
    assert cpu["rows"]["sidecar-restart1"]["cpu_s"] == pytest.approx(0.5)
    assert cpu["rows"]["sidecar"]["cpu_s"] == 0.0  # seen once: nothing to measure
    # 16 s busy, 10.5 s of it ours: 5.5 s everyone else's, 4 s idle.
    assert cpu["rows"][OTHERS]["cpu_s"] == pytest.approx(5.5)
    assert cpu["rows"][IDLE]["cpu_s"] == pytest.approx(4.0)
    assert cpu["load1_max"] == 4.0
