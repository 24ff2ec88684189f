"""Workload files load into the offline fleet; the simulator is deterministic for a seed; on
the burst workload slogate's dynamic control beats the best static quota of a sweep (the
published sweep, whose two deciding runs the suite plays again)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from sim.fleet.fleet_runs import run_many, run_once, with_kv_admission
from sim.fleet.offline import OfflineFleet, Served
from sim.fleet.run_summary import summarize
from sim.fleet.workload_files import SIMULATION_POLICY, WORKLOADS, load_workload
from sim.server.model import LatencyConfig
from sim.studies.scenarios import SWEEP, compare, gains, table


def test_every_workload_file_loads() -> None:
    for path in WORKLOADS.glob("*.yaml"):
        workload = load_workload(path)
        assert workload.arrivals and workload.duration_s > 0, path
        assert all(0 <= a.at_s < workload.duration_s for a in workload.arrivals)
        tiers = {a.key.tier.value for a in workload.arrivals}
        assert tiers <= {"critical", "standard", "sheddable"}
        tenants = {a.key.tenant for a in workload.arrivals}
        assert workload.burst_tenants <= tenants, path


def test_stream_share_and_crafted_prompts_come_from_the_workload_file(tmp_path: Path) -> None:
    text = (WORKLOADS / "field-mix.yaml").read_text()
    assert "stream_share: 0.3" in text
    every = tmp_path / "streamed.yaml"
    every.write_text(text.replace("stream_share: 0.3", "stream_share: 1.0"))
    mixed, streamed = load_workload(WORKLOADS / "field-mix.yaml"), load_workload(every)
    share = sum(a.stream for a in mixed.arrivals) / len(mixed.arrivals)
    assert 0.25 < share < 0.35, share
    assert all(a.stream for a in streamed.arrivals)
    # The share is drawn apart: the same seed gives the same times and sizes at any share.
    assert [(a.at_s, a.prompt_tokens) for a in mixed.arrivals] == [
        (a.at_s, a.prompt_tokens) for a in streamed.arrivals
    ]
    attack = load_workload(WORKLOADS / "attack-100k.yaml")
    assert {a.key.tenant for a in attack.arrivals if a.crafted} == {"attacker"}


def test_a_json_answer_is_judged_by_its_whole_time() -> None:
    """Like with like: 0.5 s to the first token is inside a 2 s TTFT SLO, but a JSON answer
    of 200 tokens done after 40 s is over TTFT SLO + 199 x the 50 ms per-token SLO (12 s)."""
    workload = load_workload(WORKLOADS / "field-mix.yaml", SIMULATION_POLICY)
    critical = next(a for a in workload.arrivals if a.key.tier.value == "critical")
    small = dataclasses.replace(critical, prompt_tokens=1000, max_tokens=256)

    def report(stream: bool) -> dict[str, Any]:
        served = Served(
            dataclasses.replace(small, stream=stream),
            "default",
            "served",
            ttft_s=0.5,
            done_s=small.at_s + 40.0,
            output_tokens=200,
        )
        fleet = OfflineFleet(workload.policy, seed=1)
        fleet.run([], until_s=1.0)
        tiers: dict[str, Any] = summarize(fleet, {"r": served}, workload)["tiers"]
        return dict(tiers["critical"])

    assert report(stream=True)["slo_attainment"] == 1.0
    judged = report(stream=False)
    assert judged["slo_attainment"] == 0.0
    assert judged["p99_over_objective"] == round(40.0 / (2.0 + 199 * 0.05), 3)


def test_rate_shape_follows_the_curve() -> None:
    workload = load_workload(WORKLOADS / "burst-10x.yaml")
    product = [a.at_s for a in workload.arrivals if a.key.tenant == "product"]
    quiet = sum(1 for t in product if t < 20)  # factor 0.15 -> 0.23: ~38 expected
    peak = sum(1 for t in product if 240 <= t < 260)  # factor 1.0: ~200 expected
    assert 20 < quiet < 60 and 160 < peak < 240, (quiet, peak)


def test_simulator_is_deterministic_for_a_seed() -> None:
    full = with_kv_admission(load_workload(WORKLOADS / "burst-10x.yaml", SIMULATION_POLICY))
    # Its first 120 s, into the first burst: determinism does not need the whole run (the
    # whole run three times was 50 s of the suite; the published comparison's re-run holds
    # a seed to the same report across processes and sessions).
    workload = dataclasses.replace(full.first(120.0), bursts=full.bursts[:1])
    first = run_once(workload, seed=3, controller=True)
    assert first == run_once(workload, seed=3, controller=True)
    assert first != run_once(workload, seed=4, controller=True)


def test_attack_key_is_contained_by_its_own_budget() -> None:
    workload = load_workload(WORKLOADS / "attack-100k.yaml")
    fleet = OfflineFleet(workload.policy, seed=1)
    results = fleet.run(workload.arrivals, until_s=workload.duration_s + 60)
    report = summarize(fleet, results, workload)
    assert report["tiers"]["critical"]["slo_attainment"] == 1.0
    attacker = [r for r in results.values() if r.arrival.key.tenant == "attacker"]
    assert sum(r.outcome != "served" for r in attacker) > 0.8 * len(attacker)


COMMITTED = Path(__file__).parents[3] / "bench" / "results" / "simulate-burst-10x.json"
REGENERATE = "regenerate it: slogate simulate --workload burst-10x --seed 7"


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    """The published comparison (`slogate simulate --workload burst-10x`): its 24-run sweep
    is a command's work (100 s of the suite on two cores); the suite re-runs the two runs
    its claim rests on and holds the file to them."""
    comparison: dict[str, Any] = json.loads(COMMITTED.read_text())
    return comparison


@pytest.fixture(scope="module")
def burst(committed: dict[str, Any]) -> dict[str, Any]:
    workload = load_workload(WORKLOADS / "burst-10x.yaml", SIMULATION_POLICY)
    best = committed["static_best"]["multipliers"]
    static, dynamic = run_many(
        [
            (workload, 7, {"timeline": True, "fixed_multipliers": best}),
            (with_kv_admission(workload), 7, {"timeline": True, "controller": True}),
        ],
        processes=2,
    )
    # Through JSON, as the file holds them (tuples become lists).
    rerun: dict[str, Any] = json.loads(json.dumps({"static": static, "dynamic": dynamic}))
    return {
        **committed,
        "static_best": {"multipliers": best, "report": rerun["static"]},
        "dynamic": rerun["dynamic"],
    }


def test_the_published_comparison_is_what_the_simulator_plays_today(
    burst: dict[str, Any], committed: dict[str, Any]
) -> None:
    """The simulator is deterministic for a seed, so a change to the sidecar's decisions or
    the engine model shows here until the published numbers are regenerated."""
    assert burst["dynamic"] == committed["dynamic"], REGENERATE
    assert burst["static_best"] == committed["static_best"], REGENERATE


def test_the_published_baseline_is_the_best_of_its_sweep(committed: dict[str, Any]) -> None:
    sweep = committed["sweep"]
    grid = list(itertools.product(*SWEEP.values()))
    assert [(r["multipliers"]["standard"], r["multipliers"]["sheddable"]) for r in sweep] == [
        (standard, sheddable) for standard, sheddable in grid
    ], REGENERATE
    # The baseline really is the best of its sweep under the stated rule.
    eligible = [
        row["report"]["goodput_tokens_per_s"]
        for row in sweep
        if row["report"]["tiers"]["critical"]["slo_attainment"] >= 0.99
    ]
    best = committed["static_best"]
    assert best["report"]["goodput_tokens_per_s"] == max(eligible)
    chosen = next(row for row in sweep if row["multipliers"] == best["multipliers"])
    assert chosen["report"]["goodput_tokens_per_s"] == max(eligible)
    for report in (best["report"], committed["dynamic"], committed["controller_only"]):
        assert set(report["tiers"]) == {"critical", "standard", "sheddable"}


def test_the_comparison_prints_and_draws(burst: dict[str, Any], tmp_path: Path) -> None:
    assert burst["dynamic"]["timeline"] and burst["dynamic"]["p99_ttft_series"]
    text = table(burst)
    assert "dynamic vs best static" in text and "static (contract, 1.0)" in text
    # The field's three rows, ours beside them (the seed's own numbers, as percentages).
    assert "| GPU utilisation | 41% -> 68% | 68.1% -> 85.1% |" in text
    assert "| burst handling (served within SLO) | 3/10 -> 8/10 | 25.3% -> 82.3% |" in text
    assert "920 -> 650" in text and "KV reserve lent in pool 'default'" in text
    pytest.importorskip("matplotlib")
    from sim.studies.plots import draw_comparison

    png = draw_comparison(burst, tmp_path / "burst.png")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_dynamic_beats_the_best_static_quota_on_the_burst_workload(
    burst: dict[str, Any],
) -> None:
    """Measured at seed 7: utilisation 0.68 -> 0.85 (+25%), goodput +18%, burst handling
    0.25 -> 0.82, no OOM, critical attainment 1.0 (bench/results/simulate-burst-10x.json).
    The issue's goal is held as it is stated: at least 0.85 with critical >= 0.999 and no
    OOM (the KV reserve lent while no tier above waits: budget.lending)."""
    static, dynamic = burst["static_best"]["report"], burst["dynamic"]
    g = gains(burst)
    assert g["utilisation_relative"] is not None and g["utilisation_relative"] > 0.2
    assert dynamic["gpu_utilisation"] >= 0.85
    assert g["goodput_relative"] is not None and g["goodput_relative"] > 0.1
    assert dynamic["burst_handling"] > static["burst_handling"] + 0.3
    assert dynamic["oom_events"] == 0
    critical = dynamic["tiers"]["critical"]
    assert critical["slo_attainment"] >= 0.999
    # Not ahead on critical P99 (the engines run fuller, and TTFT grows with the batch),
    # but held well inside the 2 s SLO.
    assert critical["p99_ttft_s"] < 0.5 * 2.0


def test_a_measured_latency_model_reaches_every_run_of_the_comparison() -> None:
    """`slogate simulate --latency-from`: the chosen static quota is re-run (for its
    timeline) on the measured model too, so its report is the sweep's, not the field's."""
    full = load_workload(WORKLOADS / "burst-10x.yaml", SIMULATION_POLICY)
    short = full.first(40.0)
    slow = LatencyConfig(base_latency_ms=900.0, prefill_ms_per_1k_tokens=120.0)
    grid = {"standard": (1.0,), "sheddable": (0.5,)}
    measured = compare(short, seed=3, latency=slow, sweep_grid=grid)
    field = compare(short, seed=3, sweep_grid=grid)

    def without_timeline(report: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in report.items() if k not in ("timeline", "p99_ttft_series")}

    best = without_timeline(measured["static_best"]["report"])
    assert best == measured["sweep"][0]["report"]
    p99 = measured["sweep"][0]["report"]["tiers"]["critical"]["p99_ttft_s"]
    assert p99 > field["sweep"][0]["report"]["tiers"]["critical"]["p99_ttft_s"]


@functools.cache
def _refused_long_critical(
    replicas: tuple[float, ...], shared_ledger: bool = True
) -> tuple[int, int]:
    """(refused, all) of field-mix's 20-30k-token critical prompts, with this many sidecar
    replicas (the policy says how many there are; the split says how Envoys spread load)."""
    workload = with_kv_admission(load_workload(WORKLOADS / "field-mix.yaml", SIMULATION_POLICY))
    policy = dataclasses.replace(
        workload.policy,
        budget=dataclasses.replace(workload.policy.budget, replicas=len(replicas)),
    )
    fleet = OfflineFleet(
        policy, seed=7, controller=True, sidecar_split=replicas, shared_ledger=shared_ledger
    )
    results = fleet.run(workload.arrivals, until_s=workload.duration_s + 60)
    long_critical = [
        r
        for r in results.values()
        if r.arrival.key.tier.value == "critical" and r.arrival.prompt_tokens >= 20_000
    ]
    return sum(1 for r in long_critical if r.outcome == "kv_full"), len(long_critical)


def test_one_sidecar_admits_most_long_critical_prompts() -> None:
    refused, total = _refused_long_critical((1.0,))
    assert refused < total // 2


def test_four_sidecars_admit_long_critical_prompts_like_one() -> None:
    """The sidecars share one KV ledger (Redis's, in production): a 20-30k critical prompt
    (~107k tokens of KV, a third of the pool) fits the pool through any of them."""
    refused, total = _refused_long_critical((0.4, 0.3, 0.2, 0.1))
    assert refused < total // 2, (refused, total)
    one, _ = _refused_long_critical((1.0,))
    assert refused <= one + 2, (refused, one)


def test_four_sidecars_with_a_ledger_each_refuse_the_long_prompts() -> None:
    """What the shared ledger is for: with a ledger each (the in-process store), each
    sidecar admits against a quarter of the cache, and the long prompts fit nowhere."""
    refused, total = _refused_long_critical((0.4, 0.3, 0.2, 0.1), shared_ledger=False)
    assert refused > total // 2, (refused, total)


def test_a_loadtest_against_a_url_is_drawn_without_fleet_scrapes(tmp_path: Path) -> None:
    """`loadtest --url` scrapes no pool: the plot shows the streams' latency alone (it
    ended in a traceback, `max()` of no pools, after printing its report)."""
    from sim.studies.plots import draw_live

    run = {
        "time_scale": 1.0,
        "workload": "smoke",
        "timeline": [
            {"at_s": float(i), "pools": {}, "breakers": {}, "multipliers": {}} for i in range(3)
        ],
        "shots": [{"stream": True, "status": 200, "ttft_s": 0.2, "scheduled_s": 1.0}],
    }
    drawn = draw_live({"protected": run}, tmp_path / "live.png")
    assert drawn.exists() and drawn.stat().st_size > 0
