"""Precise prefix state against today's approximate index and Envoy's round robin, in the
shape of llm-d's published case, in the offline fleet.

What lives here: `PrefixShape` (the case scaled to this machine), `prefix_arrivals` (its
arrivals), `compare_prefix_state` (three arms on the same arrivals: Envoy's round robin,
slogate's picker on its approximate index, slogate's picker on the engines' KV events)
and `prefix_table`.

llm-d's case (its precise-prefix-cache-aware scheduling write-up): 8 vLLM pods on 16 H100s,
150 customers each with a 6,000-token shared prefix, 1,200-token questions, the prefixes
needing about 73% of the cluster's KV, load rising in steps; precise 8,730 against
approximate 6,944 output tokens/s, p90 TTFT 0.54 s against 31 s. Here: the same prefix and
question lengths and the same share of the fleet's KV, on fewer, smaller engines (so fewer
customers), each a paged KV cache with vLLM's prefix caching in it (sim.server.paged_kv):
a customer's prefix lives in free KV until running requests need the room. Each request is
a system message (the customer's prefix) and a user message (the question): the
conversation's head is both (the sidecar's rule), so today's approximate scorer, which
leaves the head out, has no prefix to pull on, and its affinity key is the request's own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from policy.domain import ApiKey
from policy.loader import parse_policy
from policy.quantiles import quantile
from policy.schema import Policy
from sim.fleet.arrivals import Arrival
from sim.fleet.conversations import _text
from sim.fleet.engine_pool import engine_addresses
from sim.fleet.offline import OfflineFleet, Served
from sim.server.model import LatencyConfig
from sim.server.tokenizer import shared_bpe

ARMS = ("round-robin", "approximate", "precise")
# The picker's pulls that compete with an exact prefix, off (policy settings, not defaults):
# the bucket's constant tilt and the bounded-load cut-off of the prefix pull.
PULLS_OFF = (("length_weight", 0.0), ("load_bound", 100.0))
BUCKETS = (("0-4k", 4096, 1.0), ("4-8k", 8192, 1.3), ("8-32k", 32768, 1.8), ("32k+", None, 2.5))


@dataclass(frozen=True, slots=True)
class PrefixShape:
    """llm-d's case scaled: `engines` engines of `kv_tokens` KV each (blocks of
    `block_size`), customers enough that their `prefix_tokens` prefixes need `kv_share` of
    the fleet's KV, `question_tokens` questions, answers of about `output_tokens` (at most
    `max_tokens`), and the load rising through `rates` (requests a second), `step_s` each.
    `events_delay_s`: how long an engine's KV events take to reach the picker."""

    engines: int = 4
    kv_tokens: int = 120_000
    block_size: int = 16
    prefix_tokens: int = 6_000
    question_tokens: int = 1_200
    kv_share: float = 0.73
    output_tokens: int = 100
    max_tokens: int = 256
    running: int = 128
    rates: tuple[float, ...] = (8.0, 12.0, 16.0, 20.0, 24.0)
    step_s: float = 60.0
    events_delay_s: float = 0.05
    seed: int = 1
    # The sidecar's KV admission (the pool's kv_capacity_tokens in the policy): off, as in
    # llm-d's case, so the engines queue what they cannot run; on, its ledger reserves
    # prompt + max_tokens a request and credits no shared block, and binds every arm alike.
    sidecar_kv_admission: bool = False
    # Each engine's prefills wait for each other (sim.fleet.offline): a miss costs compute.
    prefill_queue: bool = True
    # The policy's engines.picking settings, where not its defaults (name, value).
    picking: tuple[tuple[str, float], ...] = ()

    @property
    def customers(self) -> int:
        return max(1, round(self.kv_share * self.engines * self.kv_tokens / self.prefix_tokens))

    @property
    def duration_s(self) -> float:
        return self.step_s * len(self.rates)


def prefix_policy(shape: PrefixShape, arm: str) -> Policy:
    return parse_policy(
        {
            "pools": {
                "default": {
                    "endpoints": engine_addresses(0, shape.engines),
                    "picker": "envoy" if arm == "round-robin" else "slogate",
                    # The engines' KV events followed (their address's port; unused here:
                    # the offline fleet hands each batch to the picker itself).
                    **({"kv_events": True} if arm == "precise" else {}),
                    **(
                        {"kv_capacity_tokens": shape.kv_tokens * shape.engines}
                        if shape.sidecar_kv_admission
                        else {}
                    ),
                    "max_num_seqs": shape.running * shape.engines,
                }
            },
            "routing": {"default_pool": "default", "rules": []},
            "keys": [{"key": "sk-customers", "tenant": "customers", "tier": "standard"}],
            # vLLM's paged KV: a token of a long prompt costs what a short one's does.
            "buckets": [
                {"name": name, "max_tokens": upper, "cost_weight": weight, "kv_weight": 1.0}
                for name, upper, weight in BUCKETS
            ],
            "breaker": {"scrape_interval_s": 1.0},
            "engines": {"picking": dict(shape.picking)},
        },
        source=f"prefix-{arm}",
    )


def prefix_arrivals(shape: PrefixShape, key: ApiKey) -> list[Arrival]:
    """Poisson arrivals at each step's rate; each a question (its own) behind one customer's
    prefix, the customer drawn uniformly."""
    rng = random.Random(shape.seed)
    draws = np.random.default_rng(shape.seed)
    vocabulary = np.array(_text(rng, 3_000)[0].split())
    prefixes = [_sized(draws, vocabulary, shape.prefix_tokens) for _ in range(shape.customers)]
    arrivals: list[Arrival] = []
    for step, rate in enumerate(shape.rates):
        at_s = step * shape.step_s
        end_s = at_s + shape.step_s
        while True:
            at_s += float(draws.exponential(1.0 / rate))
            if at_s >= end_s:
                break
            prefix = prefixes[int(draws.integers(len(prefixes)))]
            question = _sized(draws, vocabulary, shape.question_tokens)
            arrivals.append(
                Arrival(
                    at_s,
                    key,
                    prefix[1] + question[1],
                    shape.max_tokens,
                    texts=(prefix[0], question[0]),
                    text_tokens=(prefix[1], question[1]),
                    conversation_texts=2,
                    roles=("system", "user"),
                )
            )
    return arrivals


def _sized(draws: np.random.Generator, vocabulary: np.ndarray, tokens: int) -> tuple[str, int]:
    """A text of words drawn from `vocabulary` cut to `tokens` tokens (within a word's), and
    its count."""
    words = vocabulary[draws.integers(len(vocabulary), size=tokens)]
    count = shared_bpe().count
    low, high = 1, len(words)
    while low < high:  # the most words within `tokens`
        middle = (low + high + 1) // 2
        if count(" ".join(words[:middle])) <= tokens:
            low = middle
        else:
            high = middle - 1
    text = " ".join(words[:low])
    return text, count(text)


def run_arm(
    shape: PrefixShape, arm: str, arrivals: Sequence[Arrival] | None = None
) -> tuple[OfflineFleet, dict[str, Served]]:
    """One arm on the shape's arrivals (given, or drawn for the shape)."""
    policy = prefix_policy(shape, arm)
    key = policy.key_for("sk-customers")
    assert key is not None
    fleet = OfflineFleet(
        policy,
        seed=shape.seed,
        budgets=False,
        breaker=False,
        controller=True,
        kv_capacity_tokens=shape.kv_tokens * shape.engines,
        max_running=shape.running * shape.engines,
        engines={"default": shape.engines},
        block_size=shape.block_size,
        kv_events_delay_s=shape.events_delay_s if arm == "precise" else None,
        prefill_queue=shape.prefill_queue,
        latency=LatencyConfig(output_tokens_mean=shape.output_tokens),
    )
    played = list(arrivals) if arrivals is not None else prefix_arrivals(shape, key)
    results = fleet.run(played, shape.duration_s + 60.0)  # the last ones end meanwhile
    return fleet, results


def step_rows(
    shape: PrefixShape, fleet: OfflineFleet, results: dict[str, Served], arm: str
) -> list[dict[str, Any]]:
    """Per load step: output tokens a second (of the requests that arrived in the step, over
    the time from the step's start to the last of them ending), TTFT p90 and mean, the
    engines' queues (summed over the pool, sampled every evaluation), prefix hit rate."""
    rows = []
    for step, rate in enumerate(shape.rates):
        start_s, end_s = step * shape.step_s, (step + 1) * shape.step_s
        mine = [r for r in results.values() if start_s <= r.arrival.at_s < end_s]
        served = [r for r in mine if r.outcome == "served" and r.ttft_s is not None]
        ttfts = [r.ttft_s for r in served if r.ttft_s is not None]
        last_s = max((r.done_s or end_s for r in served), default=end_s)
        queue = [s.waiting["default"] for s in fleet.timeline if start_s <= s.at_s < end_s]
        prompt = sum(r.arrival.prompt_tokens for r in served)
        rows.append(
            {
                "arm": arm,
                "rate_per_s": rate,
                "requests": len(mine),
                "served": len(served),
                "output_tokens_per_s": round(
                    sum(r.output_tokens for r in served) / max(last_s - start_s, 1e-9), 1
                ),
                "ttft_p90_s": round(quantile(ttfts, 0.90, empty=math.nan), 3),
                "ttft_mean_s": round(sum(ttfts) / len(ttfts), 3) if ttfts else math.nan,
                "queue_mean": round(sum(queue) / len(queue), 1) if queue else 0.0,
                "queue_max": max(queue, default=0),
                "waited_mean_s": round(sum(r.waited_s for r in served) / len(served), 3)
                if served
                else 0.0,
                "prefix_hit_rate": round(sum(r.cached_tokens for r in served) / prompt, 4)
                if prompt
                else 0.0,
            }
        )
    return rows


def compare_prefix_state(
    shape: PrefixShape = PrefixShape(),
    arms: Sequence[str] = ARMS,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every arm on the same arrivals; per arm and load step its row."""
    key = prefix_policy(shape, "approximate").key_for("sk-customers")
    assert key is not None
    arrivals = prefix_arrivals(shape, key)
    report: dict[str, Any] = {
        "shape": {**asdict(shape), "customers": shape.customers},
        "requests": len(arrivals),
        "rows": [],
        "events": {},
    }
    for arm in arms:
        progress(f"{arm}: {len(arrivals)} requests")
        fleet, results = run_arm(shape, arm, arrivals)
        report["rows"].extend(step_rows(shape, fleet, results, arm))
        report["events"][arm] = delivered_events(fleet)
    return report


def delivered_events(fleet: OfflineFleet) -> dict[str, int]:
    """What the first sidecar's picker took in from the engines' KV events."""
    totals = {"batches": 0, "stored": 0, "removed": 0, "cleared": 0, "gaps": 0}
    for blocks in getattr(fleet.sidecars[0].picker, "cached", {}).values():
        for counts in blocks.counts.values():
            for name in totals:
                totals[name] += getattr(counts, name)
    return totals


def prefix_table(report: dict[str, Any]) -> str:
    head = (
        "| load (req/s) | arm | requests | served | output tok/s | TTFT p90 s | TTFT mean s |"
        " engine queue mean / max | sidecar wait mean s | prefix hit rate |"
    )
    lines = [head, "|" + " --- |" * 10]
    # TTFT and hit rate are of the served; a request the sidecar's waiting room timed out is
    # counted in requests and not in served.
    for r in sorted(report["rows"], key=lambda r: (r["rate_per_s"], ARMS.index(r["arm"]))):
        lines.append(
            f"| {r['rate_per_s']:g} | {r['arm']} | {r['requests']} | {r['served']} | "
            f"{r['output_tokens_per_s']:.0f} | {r['ttft_p90_s']:.2f} | {r['ttft_mean_s']:.2f} | "
            f"{r['queue_mean']:.1f} / {r['queue_max']} | {r['waited_mean_s']:.2f} | "
            f"{r['prefix_hit_rate']:.3f} |"
        )
    return "\n".join(lines)
