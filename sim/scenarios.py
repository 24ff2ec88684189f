"""Workloads from files, and the static-vs-dynamic comparison on the offline fleet.

What lives here: `load_workload` (a YAML file under sim/workloads/ -> policy keys and
arrivals), `summarize` (per-tier P99 TTFT, SLO attainment, refusals; goodput; KV use;
burst handling) and `compare`, which runs the same workload and seed with (a) the best
static per-tier quota found by a sweep and (b) slogate's dynamic controller.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import multiprocessing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from breaker.objectives import latency_objective_s
from policy import Policy, Tier, parse_policy
from sim.arrivals import Arrival, p99, poisson_arrivals
from sim.model import LatencyConfig
from sim.offline import OfflineFleet, Served

WORKLOADS = Path(__file__).parent / "workloads"

# The breaker timings used in the offline comparisons: seconds-scale windows, so that a
# 5-15 minute workload sees the breaker and the controller act.
SIMULATION_POLICY = {
    # P99 TTFT SLOs the simulated engines can meet at empty load: their P99 for a 20-32k
    # prompt is ~4-5 s (the field's tail), so a 2 s SLO there would be failed by design.
    "slos": {
        "critical": {"default": 2000, "8-32k": 6000, "32k-128k": 15000},
        "standard": {"default": 4000, "8-32k": 12000, "32k-128k": 30000},
        "sheddable": {"default": 15000, "8-32k": 30000, "32k-128k": 60000},
    },
    "breaker": {
        "window_s": 30,
        "controller_interval_s": 2,
        "scrape_interval_s": 1,
        "thresholds": {"enter_hold_s": [5, 5, 5], "cooldown_s": 30, "probe_hold_s": 15},
    },
}


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    duration_s: float
    policy: Policy
    arrivals: list[Arrival]
    bursts: list[tuple[float, float]]
    # Whose requests count as the burst; empty: everyone's inside the burst windows.
    burst_tenants: frozenset[str] = frozenset()

    def first(self, seconds: float) -> Workload:
        """The workload's first `seconds` (a quick look: `--duration-s`)."""
        return dataclasses.replace(
            self,
            arrivals=[a for a in self.arrivals if a.at_s < seconds],
            duration_s=min(self.duration_s, seconds),
        )


def workload_policy(path: Path, base_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The policy a workload runs under, as data: `base_policy` plus a key `sk-<tenant>` per
    tenant with its limits (what `slogate loadtest` gives a live stack too)."""
    return policy_document(yaml.safe_load(path.read_text(encoding="utf-8")), base_policy)


def policy_document(
    raw: dict[str, Any], base_policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`workload_policy` for a workload document already read."""
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
    return policy_raw


def load_workload(
    path: Path, base_policy: dict[str, Any] | None = None, seed: int = 1, scale: float = 1.0
) -> Workload:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return workload_from(raw, base_policy, seed, source=str(path), scale=scale)


def workload_path(name: str) -> Path:
    """A workload named on the command line: a file (a path, or any name ending in .yaml:
    e.g. one `slogate workload fit` wrote), else a name in sim/workloads/."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    return WORKLOADS / f"{name}.yaml"


def workload_from(
    raw: dict[str, Any],
    base_policy: dict[str, Any] | None = None,
    seed: int = 1,
    source: str = "",
    scale: float = 1.0,
) -> Workload:
    """`load_workload` for a workload document already read (e.g. with its rates scaled).
    `scale` multiplies every stream's arrival rate (`slogate simulate --scale 2`)."""
    duration_s = float(raw["duration_s"])
    policy = parse_policy(policy_document(raw, base_policy), source=source)
    arrivals: list[Arrival] = []
    for t_index, tenant in enumerate(raw["tenants"]):
        key = policy.key_for(f"sk-{tenant['tenant']}")
        assert key is not None
        for s_index, stream in enumerate(tenant["streams"]):
            # [low, high] (uniform), or a longer quantile table (sim.arrivals).
            prompt_tokens = [int(v) for v in stream["prompt_tokens"]]
            if len(prompt_tokens) < 2:
                raise ValueError(f"{source}: prompt_tokens needs [low, high] or a quantile table")
            arrivals += poisson_arrivals(
                key,
                float(stream["rate_per_s"]) * scale,
                float(stream.get("start_s", 0.0)),
                float(stream.get("end_s", duration_s)),
                prompt_tokens,
                int(stream["max_tokens"]),
                seed=seed * 1000 + t_index * 10 + s_index,
                shape=[(float(t), float(f)) for t, f in stream.get("shape", [])],
                stream_share=float(stream.get("stream_share", raw.get("stream_share", 1.0))),
                crafted=bool(stream.get("crafted", False)),
                output_tokens=[int(v) for v in stream.get("output_tokens", [])],
            )
    arrivals.sort(key=lambda a: a.at_s)
    bursts = [(float(a), float(b)) for a, b in raw.get("bursts", [])]
    burst_tenants = frozenset(str(t) for t in raw.get("burst_tenants", []))
    return Workload(raw["name"], duration_s, policy, arrivals, bursts, burst_tenants)


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
            "p99_ttft_s": round(p99(r.ttft_s for r in served if r.ttft_s is not None), 3)
            if served
            else None,
            # Like with like (breaker.objectives): a stream's TTFT against the TTFT SLO, a
            # JSON answer's whole time against TTFT SLO + output x the per-token SLO.
            "p99_over_objective": round(p99(ratios.values()), 3) if served else None,
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
            "wait_p50_s": round(_quantile(waits, 0.5), 3) if waits else None,
            "wait_p99_s": round(p99(waits), 3) if waits else None,
            "retried": sum(r.attempts > 1 for r in rows),
            "jain_fairness": jain_index(members) if len(members) > 1 else None,
        }
    return {"tiers": tiers, "tenants": tenants}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
SWEEP = {"standard": (0.25, 0.5, 0.75, 1.0), "sheddable": (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)}
CRITICAL_ATTAINMENT = 0.99  # what a careful operator holds the critical tier to


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
    return report


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
            "all": p99(every) if every else None,
            "critical": p99(critical) if critical else None,
        }
        for i, (every, critical) in enumerate(bins)
    ]


def _rank(report: dict[str, Any]) -> tuple[bool, float, float]:
    """A careful operator's choice: the critical tier within its SLO first, then goodput."""
    critical = report["tiers"]["critical"]
    meets = (critical["slo_attainment"] or 0.0) >= CRITICAL_ATTAINMENT
    return (meets, report["goodput_tokens_per_s"], -(critical["p99_ttft_s"] or math.inf))


def with_kv_admission(workload: Workload) -> Workload:
    """The workload on a policy that knows each pool's KV cache and batch slots: slogate's
    admission (breaker.kv_admission) then holds every tier to its share of both."""
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


def compare(
    workload: Workload,
    seed: int = 7,
    latency: LatencyConfig | None = None,
    sweep_grid: Mapping[str, tuple[float, ...]] = SWEEP,
    processes: int = 1,
) -> dict[str, Any]:
    """The best static per-tier quota (a sweep, as a careful operator would tune it) against
    slogate's dynamic control, same workload and seed. Also reported: the static quota as
    contracted (every multiplier 1.0, what most fleets run) and the controller without KV
    admission, so each part's share of the difference shows. `latency`: a measured model
    (`slogate calibrate`) instead of the field's numbers, for every run alike. `processes`:
    the independent runs (the sweep, dynamic, controller only) side by side."""
    engine: dict[str, Any] = {} if latency is None else {"latency": latency}
    grid = [
        {"critical": 1.0, "standard": standard, "sheddable": sheddable}
        for standard, sheddable in itertools.product(
            sweep_grid["standard"], sweep_grid["sheddable"]
        )
    ]
    specs = [(workload, seed, {"fixed_multipliers": m, **engine}) for m in grid]
    specs.append(
        (with_kv_admission(workload), seed, {"timeline": True, "controller": True, **engine})
    )
    specs.append((workload, seed, {"controller": True, **engine}))
    *reports, dynamic, controller_only = run_many(specs, processes)
    sweep = [{"multipliers": m, "report": r} for m, r in zip(grid, reports, strict=True)]
    best = max(sweep, key=lambda row: _rank(row["report"]))
    # Re-run for its timeline: on the same engine model as the sweep that chose it.
    best_report = run_once(
        workload, seed, timeline=True, fixed_multipliers=best["multipliers"], **engine
    )
    contract = next((row for row in sweep if set(row["multipliers"].values()) == {1.0}), None)
    if contract is None:  # a grid without the contracted point: run it, never mislabel
        unscaled = {tier.value: 1.0 for tier in Tier}
        report = run_once(workload, seed, fixed_multipliers=unscaled, **engine)
        contract = {"multipliers": unscaled, "report": report}
    return {
        "workload": workload.name,
        "seed": seed,
        "selection": f"critical SLO attainment >= {CRITICAL_ATTAINMENT}, then goodput",
        "bursts": workload.bursts,
        "static_best": {"multipliers": best["multipliers"], "report": best_report},
        "static_contract": contract,
        "dynamic": dynamic,
        "controller_only": controller_only,
        "sweep": sweep,
    }


def gains(comparison: dict[str, Any]) -> dict[str, float | None]:
    """Dynamic against the best static quota, as the issue's goal states them."""
    static, dynamic = comparison["static_best"]["report"], comparison["dynamic"]

    def relative(a: float | None, b: float | None) -> float | None:
        return None if not a or b is None else round(b / a - 1.0, 4)

    return {
        "utilisation_relative": relative(static["gpu_utilisation"], dynamic["gpu_utilisation"]),
        "goodput_relative": relative(
            static["goodput_tokens_per_s"], dynamic["goodput_tokens_per_s"]
        ),
        "critical_p99_relative": relative(
            static["tiers"]["critical"]["p99_ttft_s"], dynamic["tiers"]["critical"]["p99_ttft_s"]
        ),
        "burst_handling_static": static["burst_handling"],
        "burst_handling_dynamic": dynamic["burst_handling"],
        "oom_events_dynamic": dynamic["oom_events"],
    }


def table(comparison: dict[str, Any]) -> str:
    columns = [
        ("static (contract, 1.0)", comparison["static_contract"]["report"]),
        ("static (best sweep)", comparison["static_best"]["report"]),
        ("controller only", comparison["controller_only"]),
        ("dynamic (slogate)", comparison["dynamic"]),
    ]

    def row(label: str, value: Any) -> str:
        return f"| {label} | " + " | ".join(str(value(r)) for _, r in columns) + " |"

    lines = [
        f"workload {comparison['workload']} (seed {comparison['seed']}); best static quota "
        f"({comparison['selection']}): {comparison['static_best']['multipliers']}",
        "| metric | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " --- |" * len(columns),
        row("goodput tokens/s", lambda r: r["goodput_tokens_per_s"]),
        row("GPU utilisation (busiest pool)", lambda r: r["gpu_utilisation"]),
        row("burst handling", lambda r: r["burst_handling"]),
        row("OOM events", lambda r: r["oom_events"]),
    ]
    for tier in ("critical", "standard", "sheddable"):
        lines.append(row(f"{tier} P99 TTFT s", lambda r, t=tier: r["tiers"][t]["p99_ttft_s"]))
        lines.append(
            row(f"{tier} P99 / objective", lambda r, t=tier: r["tiers"][t]["p99_over_objective"])
        )
        lines.append(
            row(f"{tier} SLO attainment", lambda r, t=tier: r["tiers"][t]["slo_attainment"])
        )
        lines.append(row(f"{tier} refused", lambda r, t=tier: r["tiers"][t]["refused"]))
    g = gains(comparison)
    lines.append(
        f"dynamic vs best static: utilisation {_percent(g['utilisation_relative'])}, goodput "
        f"{_percent(g['goodput_relative'])}, critical P99 {_percent(g['critical_p99_relative'])}"
        f", burst handling {g['burst_handling_static']} -> {g['burst_handling_dynamic']}, "
        f"OOM events under dynamic control: {g['oom_events_dynamic']}"
    )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


# The OpenAI SDKs retry a 429 / 503 twice by default, after its Retry-After.
CLIENT_RETRIES = 2
WAITING_ROOM_RUNS: dict[str, dict[str, Any]] = {
    "today (refuse at once, no retries)": {"waiting_room": False, "client_retries": 0},
    "refuse at once, clients retry": {"waiting_room": False, "client_retries": CLIENT_RETRIES},
    "waiting room, clients retry": {"waiting_room": True, "client_retries": CLIENT_RETRIES},
}


def waiting_room_report(
    workload: Workload, seeds: Iterable[int] = (7, 11), latency: LatencyConfig | None = None
) -> dict[str, Any]:
    """slogate's dynamic control (KV admission and the controller) as it was — a full pool
    refused at once, the refusal counted as lost — against clients that retry after
    Retry-After, with and without the waiting room; same workload, each seed."""
    engine: dict[str, Any] = {} if latency is None else {"latency": latency}
    dynamic = with_kv_admission(workload)
    runs: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        runs[str(seed)] = {
            label: run_once(dynamic, seed, controller=True, **options, **engine)
            for label, options in WAITING_ROOM_RUNS.items()
        }
    return {"workload": workload.name, "runs": runs}


_ROOM = "waiting_room"


def _head(title: str, columns: list[tuple[str, Any]]) -> list[str]:
    """A comparison table's title and header: one column per run."""
    return [
        title,
        "",
        "| metric | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]


def _row(columns: list[tuple[str, Any]]) -> Callable[[str, Any], str]:
    """A function writing one metric's row: its label, then `value(run)` per run."""

    def row(label: str, value: Any) -> str:
        return f"| {label} | " + " | ".join(str(value(r)) for _, r in columns) + " |"

    return row


def waiting_room_table(report: dict[str, Any]) -> str:
    lines = []
    for seed, runs in report["runs"].items():
        columns = list(runs.items())

        row = _row(columns)
        lines += [
            *_head(f"workload {report['workload']} (seed {seed})", columns),
            row("goodput tokens/s", lambda r: r["goodput_tokens_per_s"]),
            row("GPU utilisation (busiest pool)", lambda r: r["gpu_utilisation"]),
            row("burst handling", lambda r: r["burst_handling"]),
        ]
        for tier in ("critical", "standard", "sheddable"):
            lines += [
                row(f"{tier} SLO attainment", lambda r, t=tier: r["tiers"][t]["slo_attainment"]),
                row(
                    f"{tier} refused for capacity",
                    lambda r, t=tier: r[_ROOM]["tiers"][t]["refused_for_capacity"],
                ),
                row(f"{tier} refused (all)", lambda r, t=tier: r["tiers"][t]["refused"]),
                row(
                    f"{tier} wait P50 / P99 s",
                    lambda r, t=tier: "{wait_p50_s} / {wait_p99_s}".format(**r[_ROOM]["tiers"][t]),
                ),
                row(
                    f"{tier} Jain's index", lambda r, t=tier: r[_ROOM]["tiers"][t]["jain_fairness"]
                ),
            ]
        tenants = sorted(columns[0][1][_ROOM]["tenants"])
        for tenant in tenants:
            lines.append(
                row(
                    f"{tenant}: served / requests",
                    lambda r, t=tenant: (
                        f"{r[_ROOM]['tenants'][t]['served']} / {r[_ROOM]['tenants'][t]['requests']}"
                    ),
                )
            )
        lines.append("")
    return "\n".join(lines)


# Four sidecars taking 40/30/20/10% of the traffic: Envoys do not balance evenly.
UNEVEN_SIDECARS = (0.4, 0.3, 0.2, 0.1)


def sidecars_report(
    workload: Workload,
    split: tuple[float, ...] = UNEVEN_SIDECARS,
    seeds: Iterable[int] = (7, 11),
    latency: LatencyConfig | None = None,
) -> dict[str, Any]:
    """One sidecar against `split` sidecars sharing one KV ledger (Redis's, in production)
    and against the same sidecars with a ledger each (the in-process store: each admits
    against capacity / replicas); dynamic control with the waiting room and retrying
    clients, same workload, each seed."""
    engine: dict[str, Any] = {} if latency is None else {"latency": latency}
    dynamic = with_kv_admission(workload)
    split_policy = dataclasses.replace(
        dynamic.policy,
        budget=dataclasses.replace(dynamic.policy.budget, replicas=len(split)),
    )
    each = dataclasses.replace(dynamic, policy=split_policy)
    options = {"controller": True, "client_retries": CLIENT_RETRIES, **engine}
    label = f"{len(split)} sidecars"
    runs: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        runs[str(seed)] = {
            "1 sidecar": _sidecars_run(dynamic, seed, (1.0,), True, options),
            f"{label}, one shared ledger": _sidecars_run(dynamic, seed, split, True, options),
            f"{label}, a ledger each": _sidecars_run(each, seed, split, False, options),
        }
    return {"workload": workload.name, "split": list(split), "runs": runs}


def _sidecars_run(
    workload: Workload,
    seed: int,
    split: tuple[float, ...],
    shared: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    fleet, results = run_fleet(workload, seed, sidecar_split=split, shared_ledger=shared, **options)
    report = summarize(fleet, results, workload)
    long_critical = [
        r
        for r in results.values()
        if r.arrival.key.tier is Tier.CRITICAL and r.arrival.prompt_tokens >= 20_000
    ]
    report["long_critical"] = {
        "requests": len(long_critical),
        "refused_for_capacity": sum(r.outcome in CAPACITY_REFUSALS for r in long_critical),
    }
    return report


def sidecars_table(report: dict[str, Any]) -> str:
    lines = []
    for seed, runs in report["runs"].items():
        columns = list(runs.items())
        first = columns[0][1]

        row = _row(columns)

        def relative(r: dict[str, Any], first: dict[str, Any] = first) -> str:
            return _percent(r["gpu_utilisation"] / first["gpu_utilisation"] - 1.0)

        lines += [
            *_head(
                f"workload {report['workload']} (seed {seed}, split {report['split']})", columns
            ),
            row("goodput tokens/s", lambda r: r["goodput_tokens_per_s"]),
            row("GPU utilisation (busiest pool)", lambda r: r["gpu_utilisation"]),
            row("utilisation against 1 sidecar", relative),
            row("burst handling", lambda r: r["burst_handling"]),
            row(
                "long critical prompts (20k+) refused for capacity",
                lambda r: "{refused_for_capacity} / {requests}".format(**r["long_critical"]),
            ),
        ]
        for tier in ("critical", "standard", "sheddable"):
            lines += [
                row(f"{tier} SLO attainment", lambda r, t=tier: r["tiers"][t]["slo_attainment"]),
                row(
                    f"{tier} refused for capacity",
                    lambda r, t=tier: r[_ROOM]["tiers"][t]["refused_for_capacity"],
                ),
                row(
                    f"{tier} Jain's index", lambda r, t=tier: r[_ROOM]["tiers"][t]["jain_fairness"]
                ),
            ]
        lines.append("")
    return "\n".join(lines)
