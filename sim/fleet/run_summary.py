"""What one offline run came to: the per-tier and per-tenant figures of its results.

What lives here: `summarize` (per-tier P99 TTFT, SLO attainment, refusals; goodput; KV use;
burst handling), `waiting_summary` (the waiting room's refusals, waits and Jain's fairness
index, `jain_index`), `within_objective` (a request against its latency objective) and
`p99_series` (P99 TTFT over time, for plots).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from breaker.objectives import latency_objective_s
from policy.domain import Tier
from policy.quantiles import quantile
from policy.schema import Policy
from sim.fleet.offline import OfflineFleet, Served
from sim.fleet.workload_files import Workload


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
        ratios = {id(r): _over_objective(policy, r) for r in served}
        within = [r for r in served if ratios[id(r)] <= 1.0]
        good_tokens += sum(r.output_tokens for r in within)
        met = {id(r) for r in within}  # identity: Served compares field by field, slowly
        report["tiers"][tier.value] = {
            "requests": len(rows),
            "served": len(served),
            "refused": len(rows) - len(served),
            "p99_ttft_s": round(
                quantile((r.ttft_s for r in served if r.ttft_s is not None), 0.99, empty=math.nan),
                3,
            )
            if served
            else None,
            # Like with like (breaker.objectives): a stream's TTFT against the TTFT SLO, a
            # JSON answer's whole time against TTFT SLO + output x the per-token SLO.
            "p99_over_objective": round(quantile(ratios.values(), 0.99, empty=math.nan), 3)
            if served
            else None,
            "slo_attainment": round(len(within) / len(rows), 4) if rows else None,
            "streamed_share": round(sum(r.arrival.stream for r in rows) / len(rows), 3)
            if rows
            else None,
        }
        for r in rows:
            if workload.burst_tenants and r.arrival.key.tenant not in workload.burst_tenants:
                continue
            if any(a <= r.arrival.at_s < b for a, b in workload.bursts):
                burst_total += 1
                burst_good += id(r) in met
    report["goodput_tokens_per_s"] = round(good_tokens / workload.duration_s, 1)
    utilisation = fleet.utilisation()
    # The pool that carried the traffic; idle pools (fallback, long) would dilute the mean.
    report["gpu_utilisation"] = round(utilisation[fleet.busiest_pool()], 4)
    report["utilisation_by_pool"] = {name: round(u, 4) for name, u in utilisation.items()}
    report["oom_events"] = fleet.oom_events
    report["burst_handling"] = round(burst_good / burst_total, 4) if burst_total else None
    report["waiting_room"] = waiting_summary(results, policy)
    return report


# Outcomes that say the pool was full (not a budget, not the breaker).
CAPACITY_REFUSALS = frozenset({"kv_full", "queue_full", "queue_timeout", "engine_full"})


def waiting_summary(results: dict[str, Served], policy: Policy) -> dict[str, Any]:
    """What the waiting room did: per tier the requests refused for capacity, the waits
    of the admitted (P50 / P99, zero waits included) and the retries; per tenant demand and
    service; and per tier Jain's index over the tenants' service normalised by their
    max-min fair share of what the tier was served."""
    tiers: dict[str, Any] = {}
    tenants: dict[str, dict[str, Any]] = {}
    for r in results.values():
        row = tenants.setdefault(
            r.arrival.key.tenant,
            {"tier": r.arrival.key.tier.value, "requests": 0, "served": 0, "within_slo": 0},
        )
        row["requests"] += 1
        if r.outcome == "served" and r.ttft_s is not None:
            row["served"] += 1
            row["within_slo"] += _over_objective(policy, r) <= 1.0
    for tier in Tier:
        rows = [r for r in results.values() if r.arrival.key.tier is tier]
        waits = [r.waited_s for r in rows if r.outcome == "served"]
        members = {t: v for t, v in tenants.items() if v["tier"] == tier.value}
        tiers[tier.value] = {
            "refused_for_capacity": sum(r.outcome in CAPACITY_REFUSALS for r in rows),
            "wait_p50_s": round(quantile(waits, 0.5), 3) if waits else None,
            "wait_p99_s": round(quantile(waits, 0.99), 3) if waits else None,
            "retried": sum(r.attempts > 1 for r in rows),
            "jain_fairness": jain_index(members) if len(members) > 1 else None,
        }
    return {"tiers": tiers, "tenants": tenants}


def jain_index(tenants: Mapping[str, Mapping[str, Any]]) -> float:
    """Jain's index (1: perfectly fair) over served / max-min fair share, where the fair
    shares divide what the tenants were served together by water-filling their demands (a
    tenant asking less than an equal part gets all it asked; the rest is shared)."""
    demands = {t: float(v["requests"]) for t, v in tenants.items()}
    left = float(sum(v["served"] for v in tenants.values()))
    fair: dict[str, float] = {}
    open_ = sorted(demands, key=lambda t: demands[t])
    while open_:
        part = left / len(open_)
        tenant = open_[0]
        if demands[tenant] <= part:
            fair[tenant] = demands[tenant]
            left -= demands[tenant]
            open_.pop(0)
        else:
            for name in open_:
                fair[name] = part
            break
    shares = [tenants[t]["served"] / fair[t] for t in tenants if fair.get(t)]
    if not shares:
        return 1.0
    return round(sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares)), 4)


def _bucket(policy: Policy, served: Served) -> str:
    return policy.bucket_for(served.arrival.prompt_tokens + served.arrival.max_tokens).name


def within_objective(policy: Policy, served: Served) -> bool:
    """Served within its latency objective: what SLO attainment and goodput count."""
    return (
        served.outcome == "served"
        and served.ttft_s is not None
        and _over_objective(policy, served) <= 1.0
    )


def _over_objective(policy: Policy, served: Served) -> float:
    """What the client waited for (first token streamed, whole answer otherwise) over what
    it may take: 0 when there is no objective (it counts as within), inf when nothing was
    observed."""
    arrival = served.arrival
    objective = latency_objective_s(
        policy,
        arrival.key.tier,
        _bucket(policy, served),
        arrival.stream,
        served.output_tokens,
        arrival.key.tenant,
    )
    if objective is None:
        return 0.0
    if arrival.stream:
        observed = served.ttft_s
    else:
        observed = None if served.done_s is None else served.done_s - arrival.at_s
    return math.inf if observed is None else observed / objective


def p99_series(
    results: Iterable[Served], duration_s: float, bin_s: float = 10.0
) -> list[dict[str, float | None]]:
    """P99 TTFT of the requests that arrived in each bin: all tiers, and critical alone."""
    bins: list[tuple[list[float], list[float]]] = [
        ([], []) for _ in range(math.ceil(duration_s / bin_s))
    ]
    for r in results:
        if r.ttft_s is None or r.outcome != "served":
            continue
        index = min(len(bins) - 1, int(r.arrival.at_s // bin_s))
        bins[index][0].append(r.ttft_s)
        if r.arrival.key.tier is Tier.CRITICAL:
            bins[index][1].append(r.ttft_s)
    return [
        {
            "at_s": i * bin_s,
            "all": quantile(every, 0.99) if every else None,
            "critical": quantile(critical, 0.99) if critical else None,
        }
        for i, (every, critical) in enumerate(bins)
    ]
