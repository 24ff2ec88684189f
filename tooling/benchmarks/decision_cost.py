"""`slogate bench decision-cost`: what the body decision costs at the sizes users send.

In-process, no gRPC: the sidecar's own decider (the real policy, prompt counter, breaker,
KV admission and in-process budgets) decides each request of a profile
(tooling.benchmarks.bodies), timed from the body message to the routing decision; then the
request is settled, as its access-log entry would, so budgets and KV never fill. Beside it,
for the same texts: the reference tokenizer (Hugging Face `tokenizers`, which the request
path used before) and the fitted estimate (which it decided on before, and which crafted
text fools). Writes bench/results/decision_cost.{md,json}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from admission.decision import RequestOutcome
from engines.kv_events import BlockStored, EventBatch
from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.fitted import fast_estimate
from extproc.request.tokens.native import exact_counter
from extproc.request.tokens.prompt import TokenCounter
from extproc.request.tokens.reference import ReferenceTokenizer
from extproc.runtime.sidecar import Sidecar
from extproc.service.access_log import finish
from policy.quantiles import quantile
from tooling.benchmarks.bodies import PROFILES, profile_bodies
from tooling.benchmarks.levers import BENCH_KEY, LEVERS, bench_policy

HEADERS = {
    ":path": "/v1/chat/completions",
    ":method": "POST",
    "authorization": f"Bearer {BENCH_KEY}",
}


class _Arm:
    """One setup's sidecar and what was measured on it."""

    def __init__(self, setup: str, sidecar: Sidecar, bodies: Iterator[dict[str, object]]) -> None:
        self.setup = setup
        self.sidecar = sidecar
        self.bodies = bodies
        self.decide_ms: list[float] = []
        self.judge_ms: list[float] = []  # the candidate's judgement (shadow mode)
        self.kinds: dict[str, int] = {}
        self.tokens: list[int] = []

    async def decide_one(self) -> list[str]:
        """Decide (and settle) the next request; its texts."""
        sidecar = self.sidecar
        request = next(self.bodies)
        raw = json.dumps(request).encode()
        flow = sidecar.path.decider.new_flow()
        await flow.on_request_headers({**HEADERS, "content-length": str(len(raw))}, False)
        t0 = time.perf_counter()
        routed = await flow.on_request_body(raw)
        self.decide_ms.append((time.perf_counter() - t0) * 1000)
        if sidecar.path.candidate() is not None:
            t0 = time.perf_counter()
            await sidecar.path.judge.drain()
            self.judge_ms.append((time.perf_counter() - t0) * 1000)
        decision = routed.decision
        self.kinds[decision.estimate.value] = self.kinds.get(decision.estimate.value, 0) + 1
        self.tokens.append(decision.prompt_tokens)
        sidecar.path.decider.inflight.pop(routed.tracking_id)
        outcome = RequestOutcome(
            decision, routed.tracking_id, 200, decision.prompt_tokens, 10, 0.1, 1.0, "via_upstream"
        )
        await finish(sidecar.path.recorder.record(outcome))
        messages: list[dict[str, str]] = request["messages"]  # type: ignore[assignment]
        return [m["content"] for m in messages]


async def _measure(
    sidecars: dict[str, Sidecar], name: str, bpe: DeepSeekBpe, budget_s: float
) -> list[dict[str, Any]]:
    """Every setup on the same bodies, one request each in turn (a noisy neighbour slows
    them alike): `budget_s` per setup."""
    reference = ReferenceTokenizer()
    reference_ms: list[float] = []
    estimate_ms: list[float] = []
    arms = [_Arm(setup, sidecar, profile_bodies(name, bpe)) for setup, sidecar in sidecars.items()]
    started = time.perf_counter()
    while time.perf_counter() - started < budget_s * len(arms) or len(arms[0].decide_ms) < 20:
        for arm in arms:
            texts = await arm.decide_one()
        if len(reference_ms) < 30:
            t0 = time.perf_counter()
            reference.count_many(texts)
            reference_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            sum(fast_estimate(t) for t in texts)
            estimate_ms.append((time.perf_counter() - t0) * 1000)
    return [
        {
            "setup": arm.setup,
            "profile": name,
            "describe": PROFILES[name].describe,
            "requests": len(arm.decide_ms),
            "prompt_tokens_median": statistics.median(arm.tokens),
            "decision_p50_ms": quantile(arm.decide_ms, 0.5),
            "decision_p99_ms": quantile(arm.decide_ms, 0.99),
            "count_kinds": arm.kinds,
            "reference_tokenizer_p50_ms": quantile(reference_ms, 0.5),
            "fitted_estimate_p50_ms": quantile(estimate_ms, 0.5),
            **(
                {
                    "candidate_judge_p50_ms": quantile(arm.judge_ms, 0.5),
                    "candidate_judge_p99_ms": quantile(arm.judge_ms, 0.99),
                }
                if arm.judge_ms
                else {}
            ),
        }
        for arm in arms
    ]


def publish_events(sidecar: Sidecar) -> None:
    """Every engine of a pool with kv_events says it holds one block of 16 (unrelated to the
    bodies): the engines publish, so each decision keys the prompt and searches their
    indexes, as it would in the field."""
    picker = sidecar.signals.engine_watch.picker
    for name, spec in sidecar.policy().pools.items():
        if spec.kv_events is None:
            continue
        for engine in picker.fleet.engines(name):
            stored = BlockStored((engine.slot + 1,), None, tuple(range(16)), 16)
            picker.kv_events(name, engine.address, EventBatch(0.0, (stored,)))


async def _run(
    budget_s: float, profiles: Sequence[str], levers: Sequence[str]
) -> list[dict[str, Any]]:
    """Each profile with the policy as it is and with each lever (LEVERS), interleaved
    request by request."""
    work = Path(tempfile.mkdtemp(prefix="slogate-decision-cost-"))
    bpe = DeepSeekBpe()  # sizes the bodies; each sidecar counts with its policy's engine
    engines: dict[str, TokenCounter] = {}
    sidecars = {}
    for setup in ("slogate", *levers):
        changes = LEVERS.get(setup)
        sidecar = Sidecar(bench_policy(work, changes), metrics_port=None, admin_address=None)
        engine = sidecar.policy().counting.engine
        if engine not in engines:
            engines[engine] = exact_counter(engine)
        sidecar.path.counter.use(engines[engine])
        publish_events(sidecar)
        sidecars[setup] = sidecar
    rows = []
    for name in profiles:
        for row in await _measure(sidecars, name, bpe, budget_s):
            print(json.dumps(row), flush=True)
            rows.append(row)
    for sidecar in sidecars.values():
        await sidecar.stop()
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| profile | setup | prompt tokens (median) | requests | decision p50 ms "
        "| decision p99 ms | counted | reference tokenizer p50 ms | fitted estimate p50 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["count_kinds"].items()))
        lines.append(
            f"| {r['profile']} ({r['describe']}) | {r['setup']} "
            f"| {r['prompt_tokens_median']:.0f} "
            f"| {r['requests']} | {r['decision_p50_ms']:.2f} | {r['decision_p99_ms']:.2f} "
            f"| {kinds} | {r['reference_tokenizer_p50_ms']:.2f} "
            f"| {r['fitted_estimate_p50_ms']:.3f} |"
        )
    judged = [r for r in rows if "candidate_judge_p50_ms" in r]
    if judged:
        lines += [
            "",
            "The candidate's judgement (shadow mode), after each decision, off its path:",
            "",
            "| profile | setup | judgement p50 ms | judgement p99 ms |",
            "| --- | --- | ---: | ---: |",
        ]
        lines += [
            f"| {r['profile']} | {r['setup']} | {r['candidate_judge_p50_ms']:.3f} "
            f"| {r['candidate_judge_p99_ms']:.3f} |"
            for r in judged
        ]
    return "\n".join(lines)


def run(
    out_dir: Path,
    budget_s: float = 4.0,
    profiles: Sequence[str] | None = None,
    levers: Sequence[str] = (),
) -> list[dict[str, Any]]:
    unknown = sorted(set(levers) - set(LEVERS))
    if unknown:
        raise SystemExit(f"unknown levers {unknown}; known: {sorted(LEVERS)}")
    rows = asyncio.run(_run(budget_s, list(profiles or PROFILES), levers))
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    table = _table(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decision_cost.json").write_text(
        json.dumps({"when": when, "cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n"
    )
    (out_dir / "decision_cost.md").write_text(
        f"# Body decision cost ({when})\n\n{os.cpu_count()} CPUs; in-process, the sidecar's "
        "own decider (policy, exact prompt counter, breaker, KV admission, in-process "
        "budgets), timed from the body message to the routing decision; each request is "
        "settled afterwards. Single-shot prompts are all different (each counted anew); "
        "multi_turn resends its history. For the same texts: the reference tokenizer the "
        "request path used before, and the fitted estimate it decided on before. "
        + "".join(f"{k}: the policy with {json.dumps(LEVERS[k])}. " for k in levers)
        + "\n\n"
        f"{table}\n"
    )
    print(table)
    return rows
