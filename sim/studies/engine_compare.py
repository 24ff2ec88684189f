"""Round robin against slogate's engine picking, in the offline fleet.

What lives here: `compare_picking`, which plays each workload with shared prefixes (sim.
conversations: multi-turn chats, RAG behind long shared system prompts, the field's mix)
at two loads of the same per-engine load (100 requests a second on 4 engines, 1000 on 40)
through the sidecar's own decision code (sim.fleet.offline) with the default pool's picker set to
`envoy` (Envoy's round robin) or `slogate`, plus runs where one engine dies mid-run; and
`picking_table`, its table. Each engine has its own KV cache, batch slots and prefix cache
(an LRU of message prefixes; a hit skips their prefill: sim.fleet.engine_pool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from policy.domain import Tier
from policy.loader import parse_policy
from policy.schema import Policy
from sim.fleet.arrivals import Arrival
from sim.fleet.conversations import Load, chat_arrivals, mix_arrivals, rag_arrivals
from sim.fleet.engine_pool import engine_addresses
from sim.fleet.fleet_types import EngineOutage
from sim.fleet.offline import OfflineFleet
from sim.fleet.run_summary import summarize
from sim.fleet.workload_files import Workload

TIER_SHARES = (("critical", 0.2), ("standard", 0.5), ("sheddable", 0.3))
MODES = ("envoy", "slogate")


@dataclass(frozen=True, slots=True)
class Sizing:
    """One engine: its KV cache, batch slots and prefix cache (message prefixes kept), and
    the requests a second it takes at the load compared (about 60-70% busy)."""

    kv_tokens: int = 800_000
    running: int = 256
    prefix_entries: int = 2_000
    per_engine_qps: float = 25.0


Generator = Callable[[Load], list[Arrival]]
WORKLOADS: dict[str, tuple[Generator, Sizing]] = {
    "chat": (chat_arrivals, Sizing()),
    # Longer chats behind a short system prompt: most of each prompt is its own history.
    "chat-long": (partial(chat_arrivals, turns=8, system_tokens=200, think_s=4.0), Sizing()),
    "rag": (rag_arrivals, Sizing()),
    "field-mix": (mix_arrivals, Sizing(per_engine_qps=5.0)),
}


def picking_policy(engines: int, picker: str, sizing: Sizing) -> Policy:
    addresses = engine_addresses(0, engines)
    return parse_policy(
        {
            "pools": {
                "default": {
                    "endpoints": addresses,
                    "picker": picker,
                    "kv_capacity_tokens": sizing.kv_tokens * engines,
                    "max_num_seqs": sizing.running * engines,
                }
            },
            "routing": {"default_pool": "default", "rules": []},
            "keys": [
                {"key": f"sk-{tier}", "tenant": f"tenant-{tier}", "tier": tier}
                for tier, _ in TIER_SHARES
            ],
            "breaker": {"scrape_interval_s": 1.0},
            # A 32k prompt's prefill alone is ~1.8 s in the latency model: its SLO leaves room.
            "slos": {
                "critical": {"8-32k": 6000},
                "standard": {"8-32k": 10000},
                "sheddable": {"8-32k": 20000},
            },
        },
        source=f"picking-{picker}-{engines}",
    )


def run_picking(
    workload: str,
    qps: float,
    picker: str,
    duration_s: float,
    seed: int,
    outage_at_s: float | None = None,
    replicas: int = 1,
) -> dict[str, Any]:
    """One run; `replicas`: sidecar replicas the requests are spread over evenly, each with
    its own picker and prefix index (sharing the KV ledger, as through Redis)."""
    generate, sizing = WORKLOADS[workload]
    engines = max(2, round(qps / sizing.per_engine_qps))
    policy = picking_policy(engines, picker, sizing)
    keys = [k for tier, _ in TIER_SHARES if (k := policy.key_for(f"sk-{tier}")) is not None]
    arrivals = generate(Load(keys, [share for _, share in TIER_SHARES], qps, duration_s, seed))
    outages = [EngineOutage("default", 0, outage_at_s)] if outage_at_s is not None else []
    fleet = OfflineFleet(
        policy,
        seed=seed,
        budgets=False,
        kv_capacity_tokens=sizing.kv_tokens * engines,
        max_running=sizing.running * engines,
        engines={"default": engines},
        outages=outages,
        prefix_entries=sizing.prefix_entries,
        sidecar_split=(1.0,) * replicas,
    )
    results = fleet.run(arrivals, duration_s + 30.0)  # the last ones end meanwhile
    report = summarize(fleet, results, Workload(workload, duration_s, policy, arrivals, []))
    pool = fleet.engines["default"]
    served = [r for r in results.values() if r.outcome == "served"]
    lost = [r for r in results.values() if r.outcome == "engine_lost"]
    after = [
        r for r in results.values() if outage_at_s is not None and r.arrival.at_s > outage_at_s
    ]
    return {
        "workload": workload if replicas == 1 else f"{workload}, {replicas} replicas",
        "qps": qps,
        "engines": engines,
        "picker": picker,
        "requests": len(arrivals),
        "prefix_hit_rate": round(pool.prefix_hit_rate() or 0.0, 4),
        "p99_ttft_s": {t.value: report["tiers"][t.value]["p99_ttft_s"] for t in Tier},
        "slo_attainment": {t.value: report["tiers"][t.value]["slo_attainment"] for t in Tier},
        "goodput_tokens_per_s": report["goodput_tokens_per_s"],
        "utilisation": report["gpu_utilisation"],
        "served_share": round(len(served) / max(1, len(results)), 4),
        "lost_with_the_engine": len(lost),
        "served_after_outage": {
            t.value: round(sum(r.outcome == "served" for r in rows) / len(rows), 4)
            for t in Tier
            if (rows := [r for r in after if r.arrival.key.tier is t])
        },
        "retried": fleet.retried,
        "max_level": max((s.levels.get("default", 0) for s in fleet.timeline), default=0),
    }


def compare_picking(
    duration_s: float = 60.0,
    loads: Sequence[float] = (100.0, 1000.0),
    workloads: Sequence[str] = tuple(WORKLOADS),
    seed: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    runs = []
    for workload in workloads:
        for qps in loads:
            for picker in MODES:
                progress(f"{workload} {qps:g}/s {picker}")
                runs.append(run_picking(workload, qps, picker, duration_s, seed))
    for picker in MODES:  # two sidecar replicas, each its own index: do they agree?
        progress(f"chat-long {loads[0]:g}/s {picker}, 2 replicas")
        runs.append(run_picking("chat-long", loads[0], picker, duration_s, seed, replicas=2))
    for picker in MODES:  # one engine of the smaller pool dies half way through
        progress(f"chat {loads[0]:g}/s {picker}, an engine killed at {duration_s / 2:g} s")
        outage = run_picking("chat", loads[0], picker, duration_s, seed, duration_s / 2)
        runs.append({**outage, "workload": "chat, engine killed"})
    return {"duration_s": duration_s, "seed": seed, "runs": runs}


def hit_rate_fall(report: dict[str, Any], workload: str, picker: str) -> float | None:
    """How much the prefix hit rate fell from the lowest load to the highest (0.4: 40%)."""
    rates = [
        r["prefix_hit_rate"]
        for r in report["runs"]
        if r["workload"] == workload and r["picker"] == picker
    ]
    if len(rates) < 2 or not rates[0]:
        return None
    return 1.0 - rates[-1] / rates[0]


def picking_table(report: dict[str, Any]) -> str:
    head = (
        "| workload | load | engines | picker | prefix hit rate | P99 TTFT s (crit / std / shed)"
        " | goodput tok/s | utilisation | served | lost with engine | retried | max level |"
    )
    lines = [head, "|" + " --- |" * 12]
    for r in report["runs"]:
        p99 = " / ".join(
            "-" if (v := r["p99_ttft_s"][t]) is None or math.isnan(v) else f"{v:.2f}"
            for t in ("critical", "standard", "sheddable")
        )
        lines.append(
            f"| {r['workload']} | {r['qps']:g}/s | {r['engines']} | {r['picker']} | "
            f"{r['prefix_hit_rate']:.3f} | {p99} | {r['goodput_tokens_per_s']:.0f} | "
            f"{r['utilisation']:.3f} | {r['served_share']:.4f} | {r['lost_with_the_engine']} | "
            f"{r['retried']} | L{r['max_level']} |"
        )
    falls = []
    for workload in ("chat", "chat-long", "rag"):
        for picker in MODES:
            fall = hit_rate_fall(report, workload, picker)
            if fall is not None:
                falls.append(f"{workload} {picker}: {fall:+.1%}")
    lines.append("")
    lines.append("prefix hit rate fall from the lower to the higher load: " + ", ".join(falls))
    return "\n".join(lines)
