"""`slogate replay`: recorded traffic through the one admission chain, on a virtual clock.

What lives here: `replay_arrivals` (records -> the offline fleet's arrivals: their timing,
keys, counted prompts and the output lengths that really came back), `RecordedCounter`
(answers the sidecar's prompt counter with each record's count, so no text is needed),
`replay` (runs sim.fleet.offline's fleet, the simulated engines or a calibrated latency model,
and reports what `slogate simulate` reports) and the agreement check: each replayed
request's admission outcome (admitted, or refused with its reason) against the recorded
one; `replayed_requests` (each entry's fate under a policy: what `slogate policy diff
--traffic` compares, sim.studies.policy_impact). The fleet, the sidecars and the chain are the
simulator's; nothing is copied here.

What a replay cannot reproduce, by construction: engine timing (a budget's tokens are
settled when the simulated engine ends, not when the real one did; the waiting room frees
room then too), the breaker's inputs (the simulated engines' latencies and KV use, not the
real ones), budgets already drawn on before the record's first request (a replay starts
them full), and requests refused before they were counted or whose key the policy does
not list (not replayed; counted apart). Every request is replayed as a chat request of
its recorded size (`n` > 1 as one sequence).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from admission.decision import CountKind
from extproc.request.tokens.prompt import PromptCount, PromptCounter
from extproc.service.traffic_read import TrafficEntry
from policy.domain import ApiKey
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, RecordedAnswer
from sim.fleet.fleet_types import Served
from sim.fleet.offline import OfflineFleet
from sim.fleet.run_summary import summarize, within_objective
from sim.fleet.workload_files import Workload
from sim.server.config import PoolConfig
from sim.server.model import LatencyConfig

_TEXT_PREFIX = "replay:"
_TAIL_S = 60.0  # virtual time after the last arrival for what is still running to end


class RecordedCounter(PromptCounter):
    """The prompt counter of a replay: a text `replay:<index>` counts as the record's count
    (it already holds the template's overhead and the caller's correction)."""

    def __init__(self, counts: Sequence[tuple[int, CountKind]], policy: Policy) -> None:
        super().__init__(None, policy.counting)
        self._counts = counts

    async def count(
        self, texts: Sequence[str], token_ids: int = 0, block_tokens: int = 0
    ) -> PromptCount:
        tokens, kind = self._counts[int(texts[0].removeprefix(_TEXT_PREFIX))]
        return PromptCount(tokens, kind)


@dataclass(slots=True)
class ReplayPlan:
    arrivals: list[Arrival] = field(default_factory=list)
    entries: list[TrafficEntry] = field(default_factory=list)  # the replayed, as arrivals
    counts: list[tuple[int, CountKind]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # why, for those not replayed
    start_s: float = 0.0  # the first record's time (Unix seconds): virtual time 0


def _keys_by_id(policy: Policy) -> dict[str, ApiKey]:
    return {key.key_id: key for key in policy.keys.values()}


def _decided_at(entry: TrafficEntry) -> float:
    """When the sidecar met the request with its count in hand (its budgets are checked
    then, not when its headers came): the arrival plus the decision's time, less any wait
    for room, which the replay's own waiting room plays again."""
    if entry.decided_ms is None or (entry.reason or "").startswith("queue_"):
        return entry.t
    return entry.t + max(0.0, entry.decided_ms - (entry.waited_ms or 0.0)) / 1000


def _decided_ms(entry: TrafficEntry) -> float:
    return (_decided_at(entry) - entry.t) * 1000


def _answer(entry: TrafficEntry) -> RecordedAnswer | None:
    """What the real engine did, for a request that was admitted and answered."""
    if entry.outcome != "admitted" or entry.duration_ms is None:
        return None
    # From the decision (the arrival's time in the replay) on.
    decided_ms = _decided_ms(entry)
    ttft_s = None if entry.ttft_ms is None else max(0.0, entry.ttft_ms - decided_ms) / 1000
    # It held its budgets (concurrency) until the sidecar settled it, not until Envoy's end.
    held_ms = max(entry.duration_ms, entry.settled_ms or 0.0) - decided_ms
    return RecordedAnswer(held_ms / 1000, ttft_s, entry.status)


def replay_arrivals(
    entries: Sequence[TrafficEntry], policy: Policy, recorded_timing: bool = True
) -> ReplayPlan:
    """`recorded_timing`: a request admitted in the record ends in the replay when it
    ended for real (its TTFT too, what the breaker reads); False: when the simulated
    engine says (what another policy would make of the same arrivals)."""
    plan = ReplayPlan()
    if not entries:
        return plan
    keys = _keys_by_id(policy)
    plan.start_s = entries[0].t
    for entry in entries:
        key = keys.get(entry.key or "")
        if entry.prompt is None:
            plan.skipped[f"refused before counting: {entry.reason}"] += 1
            continue
        if key is None:
            plan.skipped["key not in the policy"] += 1
            continue
        index = len(plan.arrivals)
        kind = CountKind(entry.count) if entry.count else CountKind.EXACT
        plan.counts.append((entry.prompt, kind))
        held = entry.usage_prompt if entry.usage_prompt is not None else entry.prompt
        plan.arrivals.append(
            Arrival(
                at_s=_decided_at(entry) - plan.start_s,
                key=key,
                prompt_tokens=held,
                max_tokens=entry.max_tokens,
                stream=entry.stream,
                counted_prompt_tokens=entry.prompt,
                texts=(f"{_TEXT_PREFIX}{index}",),
                text_tokens=(entry.prompt,),
                output_tokens=entry.usage_completion,
                answer=_answer(entry) if recorded_timing else None,
            )
        )
        plan.entries.append(entry)
    return plan


def _verdict(served: Served) -> str:
    return f"refused:{served.reason}" if served.reason else "admitted"


def agreement(plan: ReplayPlan, results: dict[str, Served]) -> dict[str, Any]:
    """Each replayed request's admission outcome against the recorded one."""
    matched = 0
    disagreements: Counter[str] = Counter()
    for index, entry in enumerate(plan.entries):
        replayed = _verdict(results[f"r{index}"])
        if replayed == entry.verdict:
            matched += 1
        else:
            disagreements[f"recorded {entry.verdict} -> replayed {replayed}"] += 1
    total = len(plan.entries)
    return {
        "replayed": total,
        "matched": matched,
        "agreement": round(matched / total, 4) if total else None,
        "disagreements": dict(disagreements.most_common()),
        "not_replayed": dict(plan.skipped.most_common()),
        "recorded": dict(Counter(e.verdict for e in plan.entries).most_common()),
    }


def replay_engines(policy: Policy) -> tuple[int, int]:
    """The simulated engines' KV tokens and batch slots: what the policy's default pool
    says it has, else what a simulated pool has by default (the engines `slogate up` runs).
    Their KV use is what the breaker and the controller read."""
    pool = policy.pools[policy.default_pool]
    engine = PoolConfig()
    return (
        pool.kv_capacity_tokens or engine.kv_capacity_tokens,
        pool.max_num_seqs or engine.max_running_requests,
    )


def _run(
    entries: Sequence[TrafficEntry],
    policy: Policy,
    seed: int,
    latency: LatencyConfig | None,
    recorded_timing: bool,
) -> tuple[ReplayPlan, OfflineFleet, dict[str, Served], float]:
    """The offline fleet run once over the record's arrivals: the plan, the fleet, each
    arrival's fate (by `r<index>`) and the replayed seconds."""
    plan = replay_arrivals(entries, policy, recorded_timing)
    kv_capacity_tokens, max_running = replay_engines(policy)
    last_s = plan.arrivals[-1].at_s if plan.arrivals else 0.0
    duration_s = max(1.0, math.ceil(last_s))
    fleet = OfflineFleet(
        policy,
        seed=seed,
        controller=True,  # the sidecar's quota loop always runs
        latency=latency,
        counter=RecordedCounter(plan.counts, policy),
        kv_capacity_tokens=kv_capacity_tokens,
        max_running=max_running,
    )
    results = fleet.run(plan.arrivals, until_s=duration_s + _TAIL_S)
    return plan, fleet, results, duration_s


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One recorded request's fate in a replay. `outcome`: admitted, refused, or
    not_replayed (refused before it was counted, or its key not in the policy: `reason`
    says which); `pool` where it was routed (admitted only); `ttft_s` from its arrival (None
    when it got no first token); `slo_met` as simulate counts it; `output_tokens` generated."""

    index: int  # its place in the entries replayed
    tenant: str
    tier: str
    outcome: str
    reason: str = ""
    pool: str = ""
    ttft_s: float | None = None
    slo_met: bool = False
    output_tokens: int = 0


@dataclass(slots=True)
class ReplayedRequests:
    requests: list[ReplayedRequest]  # one per entry, in the entries' order
    duration_s: float


def replayed_requests(
    entries: Sequence[TrafficEntry],
    policy: Policy,
    seed: int = 1,
    latency: LatencyConfig | None = None,
    recorded_timing: bool = True,
) -> ReplayedRequests:
    """Each entry's fate replayed under `policy` (what `slogate policy diff --traffic` runs
    once per policy: the same entries and seed give the same arrivals)."""
    plan, _fleet, results, duration_s = _run(entries, policy, seed, latency, recorded_timing)
    replayed = {id(entry): index for index, entry in enumerate(plan.entries)}
    keys = _keys_by_id(policy)
    requests: list[ReplayedRequest] = []
    for index, entry in enumerate(entries):
        at = replayed.get(id(entry))
        if at is None:
            why = "refused before counting" if entry.prompt is None else "key not in the policy"
            tenant, tier = entry.tenant or "?", entry.tier or "?"
            requests.append(ReplayedRequest(index, tenant, tier, "not_replayed", why))
            continue
        served = results[f"r{at}"]
        key = keys[entry.key or ""]
        requests.append(
            ReplayedRequest(
                index,
                key.tenant,
                key.tier.value,
                "refused" if served.reason else "admitted",
                served.reason,
                "" if served.reason else served.pool,
                served.ttft_s if served.outcome == "served" else None,
                within_objective(policy, served),
                served.output_tokens if served.outcome == "served" else 0,
            )
        )
    return ReplayedRequests(requests, duration_s)


def replay(
    entries: Sequence[TrafficEntry],
    policy: Policy,
    seed: int = 1,
    latency: LatencyConfig | None = None,
    name: str = "replay",
    recorded_timing: bool = True,
) -> dict[str, Any]:
    """The record replayed under `policy`: simulate's report plus the agreement check."""
    plan, fleet, results, duration_s = _run(entries, policy, seed, latency, recorded_timing)
    workload = Workload(name, duration_s, policy, plan.arrivals, [])
    return {
        "name": name,
        "start_s": plan.start_s,
        "duration_s": duration_s,
        "seed": seed,
        "recorded_timing": recorded_timing,
        "agreement": agreement(plan, results),
        "report": summarize(fleet, results, workload),
    }


def replay_table(report: dict[str, Any]) -> str:
    """The agreement and the per-tier summary, as markdown."""
    agree = report["agreement"]
    share = "n/a" if agree["agreement"] is None else f"{agree['agreement']:.2%}"
    lines = [
        f"replayed {agree['replayed']} requests ({report['duration_s']} s of traffic): "
        f"{agree['matched']} admission outcomes as recorded ({share})",
        "",
    ]
    for what, count in agree["disagreements"].items():
        lines.append(f"- disagree: {what}: {count}")
    for why, count in agree["not_replayed"].items():
        lines.append(f"- not replayed ({why}): {count}")
    lines += [
        "",
        "| tier | requests | served | refused | P99 TTFT s | SLO attainment |",
        "|---|---|---|---|---|---|",
    ]
    for tier, row in report["report"]["tiers"].items():
        if not row["requests"]:
            continue
        lines.append(
            f"| {tier} | {row['requests']} | {row['served']} | {row['refused']} | "
            f"{row['p99_ttft_s']} | {row['slo_attainment']} |"
        )
    summary = report["report"]
    lines += [
        "",
        f"goodput {summary['goodput_tokens_per_s']} tokens/s, "
        f"GPU utilisation {summary['gpu_utilisation']}, OOM events {summary['oom_events']}",
    ]
    return "\n".join(lines)
