"""`slogate bench prefix-index`: the engine picker's prefix index under a flood of unique
prompts, its memory and its time per request.

A flood of prompts that share nothing (what an attacker, or just many users, send) fills
each pool's index up to `engines.picking.index_entries` and no further: every prompt adds
its ~25 ladder hashes and the least recently used ones go. Measured: the index's entries
and the memory it holds (tracemalloc, the index alone), at the bound and past it, and the
time of one lookup plus one insert, per prompt size. Writes bench/results/prefix_index.md
and .json.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from engines.prefix import PrefixIndex, prompt_blocks, text_blocks
from policy.quantiles import quantile
from policy.schema import PickingConfig
from tooling.benchmarks.reports import write_report

SIZES = (1_000, 4_000, 32_000)


def _prompt(rng: np.random.Generator, tokens: int, block_tokens: int) -> Any:
    head = rng.integers(0, 120_000, 200).astype(np.uint32)
    rest = rng.integers(0, 120_000, tokens - 200).astype(np.uint32)
    return prompt_blocks(
        [text_blocks(head, block_tokens), text_blocks(rest, block_tokens)],
        [200, tokens - 200],
        block_tokens,
    )


def run(out_dir: Path, prompts: int = 40_000) -> dict[str, Any]:
    config = PickingConfig()
    rng = np.random.default_rng(7)
    tracemalloc.start()
    index = PrefixIndex(config.index_entries)
    before = tracemalloc.get_traced_memory()[0]
    growth = []
    timings: dict[int, list[float]] = {size: [] for size in SIZES}
    slots = list(range(8))
    for number in range(prompts):
        size = SIZES[number % len(SIZES)]
        blocks = _prompt(rng, size, config.block_tokens)
        started = time.perf_counter()
        index.matched_tokens(blocks, slots)
        index.add(blocks, number % 8)
        timings[size].append((time.perf_counter() - started) * 1e6)
        if (number + 1) % (prompts // 8) == 0:
            held = tracemalloc.get_traced_memory()[0] - before
            growth.append({"prompts": number + 1, "entries": len(index), "bytes": held})
    tracemalloc.stop()
    per_size = {
        str(size): {
            "p50": round(statistics.median(values), 1),
            "p99": round(quantile(values, 0.99), 1),
        }
        for size, values in timings.items()
    }
    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "index_entries_bound": config.index_entries,
        "growth": growth,
        "lookup_and_add_us": per_size,
    }
    lines = [
        "| prompts sent | index entries | index memory MiB | bytes per entry |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in growth:
        per = row["bytes"] / max(1, row["entries"])
        lines.append(
            f"| {row['prompts']} | {row['entries']} | {row['bytes'] / 2**20:.1f} | {per:.0f} |"
        )
    lines += ["", "| prompt tokens | lookup + add p50 µs | p99 µs |", "| ---: | ---: | ---: |"]
    for label, value in per_size.items():
        lines.append(f"| {label} | {value['p50']} | {value['p99']} |")
    table = "\n".join(lines)
    write_report(
        out_dir,
        "prefix_index",
        report,
        f"# Prefix index under a flood of unique prompts ({report['when']})\n\n"
        f"One pool's index (bound: engines.picking.index_entries = {config.index_entries}), "
        f"{prompts} prompts sharing nothing, 1k/4k/32k tokens in turn, 8 engines; memory is "
        "what tracemalloc sees the index hold.\n\n"
        f"{table}\n",
    )
    print(table)
    return report
