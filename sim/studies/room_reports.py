"""The waiting room's and the sidecar replicas' comparisons, and their tables.

What lives here: `waiting_room_report` / `waiting_room_table` (refusing at once against
clients that retry, with and without the waiting room), `sidecars_report` /
`sidecars_table` (one sidecar against several sharing one KV ledger, and a ledger each),
and the tables' common parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from policy.domain import Tier
from sim.fleet.fleet_runs import run_fleet, run_once, with_kv_admission
from sim.fleet.run_summary import CAPACITY_REFUSALS, summarize
from sim.fleet.workload_files import Workload
from sim.server.model import LatencyConfig


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


def _tier_rows(row: Callable[[str, Any], str], tier: str, waits: bool) -> list[str]:
    """A tier's rows in either table; `waits`: with all its refusals and its waits too."""

    def room(r: dict[str, Any]) -> dict[str, Any]:
        tiers: dict[str, Any] = r[_ROOM]["tiers"]
        return tiers[tier]

    rows = [
        row(f"{tier} SLO attainment", lambda r: r["tiers"][tier]["slo_attainment"]),
        row(f"{tier} refused for capacity", lambda r: room(r)["refused_for_capacity"]),
    ]
    if waits:
        rows += [
            row(f"{tier} refused (all)", lambda r: r["tiers"][tier]["refused"]),
            row(
                f"{tier} wait P50 / P99 s",
                lambda r: "{wait_p50_s} / {wait_p99_s}".format(**room(r)),
            ),
        ]
    return [*rows, row(f"{tier} Jain's index", lambda r: room(r)["jain_fairness"])]


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
            lines += _tier_rows(row, tier, waits=True)
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
            lines += _tier_rows(row, tier, waits=False)
        lines.append("")
    return "\n".join(lines)
