"""Workloads from files, and the static-vs-dynamic comparison on the offline fleet.

What lives here: `load_workload` (a YAML file under sim/workloads/ -> policy keys and
arrivals), `summarize` (per-tier P99 TTFT, SLO attainment, refusals; goodput; KV use;
burst handling) and `compare`, which runs the same workload and seed with (a) the best
static per-tier quota found by a sweep and (b) slogate's dynamic controller.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from budget.policy import Policy, Tier, parse_policy
from sim.offline import Arrival, OfflineFleet, Served, p99, poisson_arrivals

WORKLOADS = Path(__file__).parent / "workloads"


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    duration_s: float
    policy: Policy
    arrivals: list[Arrival]
    bursts: list[tuple[float, float]]


def load_workload(path: Path, base_policy: dict[str, Any] | None = None, seed: int = 1) -> Workload:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    duration_s = float(raw["duration_s"])
    policy_raw = dict(base_policy or {})
    policy_raw["keys"] = [
        {
            "key": f"sk-{t['tenant']}",
            "tenant": t["tenant"],
            "tier": t["tier"],
            "limits": t.get("limits", {}),
        }
        for t in raw["tenants"]
    ]
    policy = parse_policy(policy_raw, source=str(path))
    arrivals: list[Arrival] = []
    for t_index, tenant in enumerate(raw["tenants"]):
        key = policy.key_for(f"sk-{tenant['tenant']}")
        assert key is not None
        for s_index, stream in enumerate(tenant["streams"]):
            low, high = stream["prompt_tokens"]
            arrivals += poisson_arrivals(
                key,
                float(stream["rate_per_s"]),
                float(stream.get("start_s", 0.0)),
                float(stream.get("end_s", duration_s)),
                (int(low), int(high)),
                int(stream["max_tokens"]),
                seed=seed * 1000 + t_index * 10 + s_index,
            )
    arrivals.sort(key=lambda a: a.at_s)
    bursts = [(float(a), float(b)) for a, b in raw.get("bursts", [])]
    return Workload(raw["name"], duration_s, policy, arrivals, bursts)


def summarize(
    fleet: OfflineFleet, results: dict[str, Served], workload: Workload
) -> dict[str, Any]:
    policy = workload.policy
    report: dict[str, Any] = {"tiers": {}}
    good_tokens = 0
    burst_total = burst_good = 0
    for tier in Tier:
        rows = [r for r in results.values() if r.arrival.key.tier is tier]
        served = [r for r in rows if r.outcome == "served" and r.ttft_s is not None]
        within = [
            r
            for r in served
            if r.ttft_s is not None
            and r.ttft_s * 1000 <= (policy.slo_ms(tier, _bucket(policy, r)) or math.inf)
        ]
        good_tokens += sum(r.output_tokens for r in within)
        report["tiers"][tier.value] = {
            "requests": len(rows),
            "served": len(served),
            "refused": len(rows) - len(served),
            "p99_ttft_s": round(p99(r.ttft_s for r in served if r.ttft_s is not None), 3)
            if served
            else None,
            "slo_attainment": round(len(within) / len(rows), 4) if rows else None,
        }
        for r in rows:
            if any(a <= r.arrival.at_s < b for a, b in workload.bursts):
                burst_total += 1
                burst_good += r in within
    report["goodput_tokens_per_s"] = round(good_tokens / workload.duration_s, 1)
    report["kv_utilisation"] = round(sum(fleet.kv_samples) / max(1, len(fleet.kv_samples)), 4)
    report["burst_handling"] = round(burst_good / burst_total, 4) if burst_total else None
    return report


def _bucket(policy: Policy, served: Served) -> str:
    return policy.bucket_for(served.arrival.prompt_tokens + served.arrival.max_tokens).name


def run_once(workload: Workload, seed: int, **options: Any) -> dict[str, Any]:
    fleet = OfflineFleet(workload.policy, seed=seed, kv_capacity_tokens=300_000, **options)
    results = fleet.run(workload.arrivals, until_s=workload.duration_s + 60)
    return summarize(fleet, results, workload)


def _rank(report: dict[str, Any]) -> tuple[float, float]:
    critical_p99 = report["tiers"]["critical"]["p99_ttft_s"] or math.inf
    return (report["goodput_tokens_per_s"], -critical_p99)


def compare(workload: Workload, seed: int = 7) -> dict[str, Any]:
    """The best static per-tier quota (a sweep, as a careful operator would tune it) against
    the dynamic controller, same workload and seed."""
    sweep = []
    for standard, sheddable in itertools.product((0.5, 0.75, 1.0), (0.1, 0.25, 0.5, 1.0)):
        multipliers = {"critical": 1.0, "standard": standard, "sheddable": sheddable}
        report = run_once(workload, seed, fixed_multipliers=multipliers)
        sweep.append({"multipliers": multipliers, "report": report})
    best = max(sweep, key=lambda row: _rank(row["report"]))
    dynamic = run_once(workload, seed, controller=True)
    return {
        "workload": workload.name,
        "seed": seed,
        "static_best": best,
        "dynamic": dynamic,
        "sweep": sweep,
    }


def table(comparison: dict[str, Any]) -> str:
    static, dynamic = comparison["static_best"]["report"], comparison["dynamic"]
    lines = [
        f"workload {comparison['workload']} (seed {comparison['seed']}); static = best of the "
        f"sweep: {comparison['static_best']['multipliers']}",
        "| metric | static (best sweep) | dynamic |",
        "| --- | --- | --- |",
        f"| goodput tokens/s | {static['goodput_tokens_per_s']} "
        f"| {dynamic['goodput_tokens_per_s']} |",
        f"| KV utilisation | {static['kv_utilisation']} | {dynamic['kv_utilisation']} |",
        f"| burst handling | {static['burst_handling']} | {dynamic['burst_handling']} |",
    ]
    for tier in ("critical", "standard", "sheddable"):
        s, d = static["tiers"][tier], dynamic["tiers"][tier]
        lines.append(f"| {tier} P99 TTFT s | {s['p99_ttft_s']} | {d['p99_ttft_s']} |")
        lines.append(f"| {tier} SLO attainment | {s['slo_attainment']} | {d['slo_attainment']} |")
        lines.append(f"| {tier} refused | {s['refused']} | {d['refused']} |")
    return "\n".join(lines)
