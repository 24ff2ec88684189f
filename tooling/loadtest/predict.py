"""`slogate loadtest --predict` and `--capacity`: the offline simulator in the live pools'
shape, what it predicts of a live run, the errors against one, and capacity by rate multiple."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from policy.domain import Tier
from policy.loader import parse_policy
from policy.quantiles import quantile
from sim.fleet.offline import OfflineFleet
from sim.fleet.run_summary import summarize
from sim.fleet.sidecar import refusal_kind
from sim.fleet.workload_files import Workload, workload_from
from sim.server.config import PoolConfig
from tooling.loadtest.report import _format, _markdown
from tooling.loadtest.shots import Shot

# The live stack's simulated pools as `slogate up` starts them (sim.server.config.PoolConfig).
LIVE_POOL = PoolConfig()


def under(workload: Workload, policy_raw: Mapping[str, Any]) -> Workload:
    """The same arrivals under another policy (each key as that policy defines it)."""
    policy = parse_policy(dict(policy_raw))
    arrivals = []
    for arrival in workload.arrivals:
        key = policy.key_for(f"sk-{arrival.key.tenant}")
        assert key is not None, arrival.key.tenant
        arrivals.append(dataclasses.replace(arrival, key=key))
    return dataclasses.replace(workload, policy=policy, arrivals=arrivals)


def predict(workload: Workload, seed: int = 0) -> dict[str, Any]:
    """What the offline simulator says a live run of `workload` will measure: the same
    arrivals through the sidecar's own code (sim.fleet.offline) in front of engines shaped as the
    live stack's simulated pools (KV capacity, batch slots), on a virtual clock."""
    policy = workload.policy
    fleet = OfflineFleet(
        policy,
        seed=seed,
        controller=policy.breaker.controller_enabled,
        kv_capacity_tokens=LIVE_POOL.kv_capacity_tokens,
        max_running=LIVE_POOL.max_running_requests,
        max_queue=LIVE_POOL.max_queue,
        waiting_room=policy.waiting_room.enabled,
    )
    results = fleet.run(workload.arrivals, until_s=workload.duration_s + 60)
    summary = summarize(fleet, results, workload)
    refusals: dict[str, int] = {}
    for served in results.values():
        if served.outcome != "served":
            refusals[served.outcome] = refusals.get(served.outcome, 0) + 1
    return {
        "utilisation_by_pool": summary["utilisation_by_pool"],
        "goodput_tokens_per_s": summary["goodput_tokens_per_s"],
        "burst_handling": summary["burst_handling"],
        "tiers": {
            tier.value: {
                # Streams only, like with like: a JSON answer's first byte is its whole
                # answer live, while the simulator's ttft_s is its first token.
                "p99_stream_ttft_s": quantile(
                    [
                        r.ttft_s
                        for r in results.values()
                        if r.arrival.key.tier is tier
                        and r.arrival.stream
                        and r.outcome == "served"
                        and r.ttft_s is not None
                    ],
                    0.99,
                    empty=None,
                ),
                "slo_attainment_of_all": summary["tiers"][tier.value]["slo_attainment"],
            }
            for tier in Tier
        },
        "refusals": dict(sorted(refusals.items())),
    }


def live_utilisation(
    timeline: Sequence[Mapping[str, Any]], max_running: int = LIVE_POOL.max_running_requests
) -> dict[str, float]:
    """Per pool, as the offline fleet measures it (OfflineFleet.utilisation): the fuller of
    the KV cache and the batch slots, averaged over the run, from the engines' scrapes."""
    pools: dict[str, list[float]] = {}
    for row in timeline:
        for pool, values in row["pools"].items():
            occupancy = max(
                values.get("kv_cache_usage_perc", 0.0),
                values.get("num_requests_running", 0.0) / max_running,
            )
            pools.setdefault(pool, []).append(occupancy)
    return {pool: sum(v) / len(v) for pool, v in sorted(pools.items()) if v}


def live_refusals(shots: Sequence[Shot]) -> dict[str, int]:
    """The live run's refusals by the offline fleet's kinds; an answer without slogate's
    reason came from the engine: a 503 is its full queue (`engine_full`), anything else
    its failure (`oom`), as the offline fleet names them."""
    counts: dict[str, int] = {}
    for shot in shots:
        if shot.status == 200:
            continue
        if shot.reason:
            kind = refusal_kind(shot.reason)
        else:
            kind = "engine_full" if shot.status == 503 else "oom"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def prediction_errors(live: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, Any]:
    """Per metric: live, predicted, and the error (live / predicted - 1; None where the
    prediction is 0 or missing)."""

    def row(live_value: float | None, predicted_value: float | None) -> dict[str, Any]:
        error = None
        if live_value is not None and predicted_value:
            error = round(live_value / predicted_value - 1.0, 4)
        return {"live": live_value, "predicted": predicted_value, "error": error}

    errors: dict[str, Any] = {}
    used = live_utilisation(live.get("timeline") or [])
    for pool, predicted_use in predicted["utilisation_by_pool"].items():
        if predicted_use >= 0.01 or used.get(pool, 0.0) >= 0.01:  # idle pools say nothing
            errors[f"utilisation {pool}"] = row(used.get(pool), predicted_use)
    errors |= {
        "goodput_tokens_per_s": row(
            live["all"]["goodput_tokens_per_s"], predicted["goodput_tokens_per_s"]
        ),
        "burst_handling": row(live.get("burst_handling"), predicted["burst_handling"]),
    }
    shots = [Shot(**s) for s in live["shots"]]
    for tier, values in predicted["tiers"].items():
        streams = [
            s.ttft_s / live["time_scale"]
            for s in shots
            if s.tier == tier and s.stream and s.status == 200 and s.ttft_s is not None
        ]
        errors[f"{tier} p99_stream_ttft_s"] = row(
            quantile(streams, 0.99, empty=None), values["p99_stream_ttft_s"]
        )
        errors[f"{tier} slo_attainment_of_all"] = row(
            live["tiers"][tier]["slo_attainment_of_all"], values["slo_attainment_of_all"]
        )
    refused = live_refusals(shots)
    for kind in sorted(set(refused) | set(predicted["refusals"])):
        errors[f"refused {kind}"] = row(refused.get(kind, 0), predicted["refusals"].get(kind, 0))
    return errors


def prediction_table(errors: Mapping[str, Mapping[str, Any]]) -> str:
    return "\n".join(
        _markdown(
            ("metric", "live", "simulated", "error"),
            [
                (
                    name,
                    _format(r["live"], "{:.3f}"),
                    _format(r["predicted"], "{:.3f}"),
                    _format(None if r["error"] is None else 100 * r["error"], "{:+.1f}%"),
                )
                for name, r in errors.items()
            ],
        )
    )


def capacity(
    path: Path,
    base_policy: Mapping[str, Any],
    factors: Sequence[float],
    seed: int = 7,
    duration_s: float | None = None,
) -> list[dict[str, Any]]:
    """What the live stack can take of a workload: the offline fleet in the live pools'
    shape (`predict`) playing the workload at each multiple of its rates. No live run; at
    time scale 1 the simulator is within 10% of the live stack on utilisation and goodput
    (bench/results/loadtest-soak), which is what this is read for."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    rows = []
    for factor in factors:
        scaled = copy.deepcopy(raw)
        for tenant in scaled["tenants"]:
            for stream in tenant["streams"]:
                stream["rate_per_s"] = float(stream["rate_per_s"]) * factor
        workload = workload_from(scaled, dict(base_policy), seed, source=f"{path} x{factor:g}")
        if duration_s is not None:
            workload = workload.first(duration_s)
        predicted = predict(workload, seed)
        rows.append({"factor": factor, "requests": len(workload.arrivals), **predicted})
    return rows


def capacity_limit(rows: Sequence[Mapping[str, Any]], attainment: float = 0.99) -> float | None:
    """The highest multiple at which every tier's attainment (of all its requests, refusals
    counted as misses) is at least `attainment`, with every lower multiple meeting it too."""
    best = None
    for row in sorted(rows, key=lambda r: r["factor"]):
        tiers = row["tiers"].values()
        if any((t["slo_attainment_of_all"] or 0.0) < attainment for t in tiers):
            break
        best = row["factor"]
    return best


def capacity_table(rows: Sequence[Mapping[str, Any]]) -> str:
    tiers = [t.value for t in Tier]
    head = ["rates x", "requests", "utilisation (busiest pool)", "goodput tok/s"]
    head += [f"{t} attainment" for t in tiers] + [f"{t} P99 TTFT s (streams)" for t in tiers]
    lines = _markdown(
        (*head, "refused"),
        [
            (
                f"{r['factor']:g}",
                f"{r['requests']}",
                f"{max(r['utilisation_by_pool'].values(), default=0.0):.3f}",
                f"{r['goodput_tokens_per_s']:.0f}",
                *(f"{r['tiers'][t]['slo_attainment_of_all']:.3f}" for t in tiers),
                *(_format(r["tiers"][t]["p99_stream_ttft_s"]) for t in tiers),
                ", ".join(f"{k} {v}" for k, v in r["refusals"].items()) or "-",
            )
            for r in rows
        ],
    )
    return "\n".join(lines).strip()
