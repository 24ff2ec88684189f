"""`slogate loadtest`: a `sim/workloads/` file played as open-loop arrivals against a live
stack, measured the way its users see it.

What lives here: `Shot` (one request as its client saw it), `play` (every arrival sent at
its own time, whatever the stack answers: no coordinated omission), `report` and `table`
(per tier and tenant: statuses by reason, P50/P99 TTFT and latency, SLO attainment, and how
late the arrivals left). Prompts are the simulator's own texts (sim.fleet.prompts), so the
sidecar counts what the offline simulator counts; keys are the workload's `sk-<tenant>`.

Time scale: the arrival times are multiplied by it, as the simulated pools' latencies are
(`slogate up --time-scale`), so the load on the pools is the workload's; reported times
are divided by it (workload seconds). Envoy's and the sidecar's own milliseconds are not
scaled, so at 0.1 they weigh ten times more in the reported times than they do live.

On schedule: each arrival is a task started at `start + at_s x scale`; a request never waits
for another's answer. How late each one really left is measured (`lag`) and reported: a
loaded generator shows up there instead of silently thinning the load.

The parts: tooling.loadtest.shots (sending, measuring), tooling.loadtest.scrape (processes,
the signals' timeline, the drain), tooling.loadtest.faults, tooling.loadtest.report (the
report and its tables), tooling.loadtest.predict (prediction, capacity); `run_live` and the
policies it runs under (`unprotected_policy`, `VLLM_POLICY`) live here.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from policy.domain import Tier
from policy.schema import BreakerThresholds, BudgetStoreKind
from sim.fleet.workload_files import Workload
from tooling.loadtest.faults import Fault, StackFaults, mark_faults
from tooling.loadtest.report import report
from tooling.loadtest.scrape import ProcessSampler, SignalSampler, drained
from tooling.loadtest.shots import play
from tooling.stack.local import LocalStack, StackPorts


def unprotected_policy(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The same policy with slogate's admission off: routing only. The same Envoy and the
    same sidecar still route by context and refuse what no engine could take (a body over
    the limit, a context over the model's), but no key has a budget, the breaker has no
    reachable threshold, the controller and the waiting room are off, and no pool has a KV
    capacity to admit against: what the fleet does without protection."""
    policy = copy.deepcopy(dict(raw))
    policy["tiers"] = {tier.value: {} for tier in Tier}
    for key in policy.get("keys", []):
        key.pop("limits", None)
    breaker = policy.setdefault("breaker", {})
    breaker["controller_enabled"] = False
    thresholds = breaker.setdefault("thresholds", {})
    for name in UNREACHABLE:
        thresholds[name] = 1e9
    policy.setdefault("waiting_room", {})["enabled"] = False
    for pool in (policy.get("pools") or {}).values():
        pool.pop("kv_capacity_tokens", None)
        pool.pop("max_num_seqs", None)
    return policy


# Every level's condition (l1_p99_over_slo, ..., l3_gpu_memory): never reached at 1e9.
UNREACHABLE = tuple(
    f.name for f in dataclasses.fields(BreakerThresholds) if f.name[:3] in ("l1_", "l2_", "l3_")
)


# The workload policy for a stack whose default pool is a real vLLM (`--engine vllm`): a
# transformer's KV per token does not grow with the context, so every bucket weighs 1 (the
# field's weights would refuse anything past ~5.7k tokens of its 10,240-token cache), and the
# engine schedules by the priority slogate writes.
VLLM_POLICY: dict[str, Any] = {
    "buckets": [
        {"name": "0-4k", "max_tokens": 4096, "cost_weight": 1.0, "kv_weight": 1.0},
        {"name": "4-8k", "max_tokens": 8192, "cost_weight": 1.3, "kv_weight": 1.0},
        {"name": "8-32k", "max_tokens": 32768, "cost_weight": 1.8, "kv_weight": 1.0},
        {"name": "32k-128k", "max_tokens": 131072, "cost_weight": 2.5, "kv_weight": 1.0},
        {"name": "128k+", "cost_weight": 3.0, "kv_weight": 1.0},
    ],
    # The engine's latency at empty load, as `slogate calibrate` measured the tiny model on
    # this 2-core machine (2026-12-05, load average 10: 0-4k TTFT P99 342 ms): the waiting
    # room derives each tier's longest wait from what the SLO leaves after the expected
    # prefill; without a model it assumes half the SLO is prefill (standard waited 0.5 s and
    # was refused `queue_timeout` at a burst's peak that the engine served in time).
    "latency_model": {
        "default": {
            "base_latency_ms": 8.4,
            "prefill_ms_per_1k_tokens": 65.9,
            "bucket_slopes": {"0-4k": 1.0, "4-8k": 2.891},
        }
    },
    "pools": {
        "default": {"endpoints": ["127.0.0.1:18001"], "priority_scheduling": True},
        "long": {"endpoints": ["127.0.0.1:18002"]},
        "fallback": {"endpoints": ["127.0.0.1:18003"]},
    },
}


def run_live(
    workload: Workload,
    policy_raw: Mapping[str, Any],
    keys: Mapping[str, str],
    time_scale: float,
    faults: Sequence[Fault] = (),
    store: BudgetStoreKind | None = None,
    url: str | None = None,
    engine: str = "sim",
    admission: bool = True,
    start_unix: float | None = None,
) -> dict[str, Any]:
    """One loadtest: against `url`, or a local stack started for it under `policy_raw`
    (stopped afterwards: after the drain, what it still holds is read first); `engine`
    "vllm": the stack's default pool is a real vLLM (tooling.stack.vllm_engine); `admission`
    False: the unprotected run (see unprotected_policy); `start_unix`: the wall time the
    first arrival is due (a policy's calendar was declared against it; see
    tooling.loadtest.ahead_arms)."""
    stack = None
    if url is None:
        work_dir = Path(tempfile.mkdtemp(prefix="slogate-loadtest-"))
        policy_path = work_dir / "workload-policy.yaml"
        policy_path.write_text(yaml.safe_dump(dict(policy_raw)))
        ports = StackPorts(0, 0, 0, 0, 0, {name: 0 for name in workload.policy.pools})
        stack = LocalStack(
            policy_path,
            work_dir,
            ports,
            time_scale,
            budget_store=store,
            engine=engine,
            # Unprotected: a real engine's capacity does not become KV admission either.
            admit_engine_capacity=admission,
        ).start()
        url = stack.url
        print(f"slogate loadtest: stack up at {url} (logs {work_dir})", flush=True)
    sampler = injector = None
    if stack is not None:
        running = stack
        # The load generator too: it shares the machine's cores with what it measures.
        sampler = ProcessSampler(
            lambda: {
                "loadgen": os.getpid(),
                **{p.name: p.pid for p in running.processes if p.pid is not None},
            }
        )
        injector = StackFaults(stack, faults, time_scale) if faults else None
    engines = (
        {p: [f"{url}/metrics" for url in stack.engine_urls(p)] for p in stack.pool_ports}
        if stack
        else {}
    )
    signals = SignalSampler(engines, stack.metrics_url if stack else None)
    left = None
    try:
        played = asyncio.run(
            play(
                workload.arrivals,
                url,
                keys,
                time_scale,
                sampler=sampler,
                alongside=injector,
                watch=signals.run if stack else None,
                start_unix=start_unix,
            )
        )
        if stack is not None:
            left = asyncio.run(drained(stack.admin_address))
    finally:
        if stack is not None:
            stack.stop()
    shots = played.shots
    windows = injector.windows if injector is not None else []
    mark_faults(shots, windows)
    result = report(
        shots,
        workload.policy,
        time_scale,
        workload.name,
        processes=sampler.summary() if sampler is not None else None,
        cpu=sampler.cpu() if sampler is not None else None,
        after_drain=left,
        faults=windows,
        stalls=played.stalls,
        signals=signals.summary(),
        timeline=signals.timeline,
        duration_s=workload.duration_s,
        bursts=workload.bursts,
        burst_tenants=workload.burst_tenants,
    )
    # The machine is shared: what else ran shows here (1, 5, 15 min), read at the end.
    result["load_average"] = [round(v, 2) for v in os.getloadavg()]
    if start_unix is not None:
        result["started_late_s"] = round(played.started_late_s, 3)
    return result
