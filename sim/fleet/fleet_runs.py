"""Running workloads on the offline fleet: the fleet's shape and one run, or many side by side.

What lives here: `FLEET` (one vLLM-like engine per pool: `KV_CAPACITY_TOKENS`,
`MAX_NUM_SEQS`, a 5% overcommit), `run_fleet` / `run_once` (a workload, a seed and the
fleet's options -> its results / their summary), `run_many` (many runs, in child processes
if asked) and `with_kv_admission` (the workload's policy told each pool's KV cache and slots).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
from collections.abc import Sequence
from typing import Any

from sim.fleet.offline import OfflineFleet, Served
from sim.fleet.run_summary import p99_series, summarize
from sim.fleet.workload_files import Workload

# One engine per pool, vLLM-like: the KV cache (not max_num_seqs) bounds the batch, and an
# engine configured tight admits 5% past its real capacity -- requests started there fail
# like an OOM half of the time, as in the simulated pool.
KV_CAPACITY_TOKENS = 300_000
MAX_NUM_SEQS = 256  # vLLM's default batch slots
FLEET = {
    "kv_capacity_tokens": KV_CAPACITY_TOKENS,
    "max_running": MAX_NUM_SEQS,
    "overcommit_ratio": 1.05,
}


def run_fleet(
    workload: Workload, seed: int, **options: Any
) -> tuple[OfflineFleet, dict[str, Served]]:
    fleet = OfflineFleet(workload.policy, seed=seed, **{**FLEET, **options})
    return fleet, fleet.run(workload.arrivals, until_s=workload.duration_s + 60)


def run_once(
    workload: Workload, seed: int, timeline: bool = False, **options: Any
) -> dict[str, Any]:
    fleet, results = run_fleet(workload, seed, **options)
    report = summarize(fleet, results, workload)
    if timeline:  # for plots: every 5th breaker evaluation, P99 TTFT per 10 s of arrivals
        report["timeline"] = [dataclasses.asdict(sample) for sample in fleet.timeline[::5]]
        report["p99_ttft_series"] = p99_series(results.values(), workload.duration_s)
        if fleet.lending_history:  # the KV share lent to sheddable (budget.lending), per move
            report["kv_lending"] = [list(move) for move in fleet.lending_history]
    return report


def with_kv_admission(workload: Workload) -> Workload:
    """The workload on a policy that knows each pool's KV cache and batch slots: slogate's
    admission (admission.kv.capacity) then holds every tier to its share of both."""
    pools = {
        name: dataclasses.replace(
            pool, kv_capacity_tokens=KV_CAPACITY_TOKENS, max_num_seqs=MAX_NUM_SEQS
        )
        for name, pool in workload.policy.pools.items()
    }
    policy = dataclasses.replace(workload.policy, pools=pools)
    return dataclasses.replace(workload, policy=policy)


def _run_spec(spec: tuple[Workload, int, dict[str, Any]]) -> dict[str, Any]:
    workload, seed, options = spec
    return run_once(workload, seed, **options)


def run_many(
    specs: Sequence[tuple[Workload, int, dict[str, Any]]], processes: int = 1
) -> list[dict[str, Any]]:
    """`run_once` for each (workload, seed, options), in order; with `processes` > 1 in
    that many child processes (each run is seeded and independent: the same reports)."""
    if processes <= 1 or len(specs) <= 1:
        return [_run_spec(spec) for spec in specs]
    # spawn, not fork: a test process has gRPC and event-loop threads a fork would copy.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        return list(pool.map(_run_spec, specs))
