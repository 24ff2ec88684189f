"""The case of `slogate bench prefix-vllm` (tooling.benchmarks.prefix_live): llm-d's
precise-prefix workload scaled down, and its seeded arrivals.

What lives here: the case's shape (`Shape`: customers, shared-prompt and question and answer
lengths, load steps, each engine's KV blocks), its Poisson arrivals (`arrivals`, the same
every run for one seed) and each customer's shared prompt (`system_prompt`, headed by the
arm's number). Pure, no engines: the run plays it (prefix_live), the report reads its shape
(prefix_report) and the CLI builds it from its flags (tooling.cli.bench), without the run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tooling.stack.tiny_model import WORDS
from tooling.stack.vllm_engine import BLOCK_TOKENS


@dataclass(frozen=True)
class Shape:
    """The case, scaled: `customers` shared prompts of `prefix_tokens`, questions of about
    `question_tokens`, answers of `answer_tokens`; requests a second per step."""

    customers: int = 12
    prefix_tokens: int = 1024
    question_tokens: int = 192
    answer_tokens: int = 16
    rates: tuple[float, ...] = (4.0, 8.0, 12.0)
    step_s: float = 15.0
    kv_blocks: int = 64  # per engine, of 128 tokens
    seed: int = 38

    def prefix_share(self) -> float:
        """What the shared prompts need of the two engines' KV cache together."""
        return self.customers * self.prefix_tokens / (2 * self.kv_blocks * BLOCK_TOKENS)


@dataclass(frozen=True)
class Arrival:
    at_s: float
    step: int
    customer: int
    question: str


def arrivals(shape: Shape) -> list[Arrival]:
    """Poisson arrivals at each step's rate, each a uniformly chosen customer's question."""
    rng = random.Random(shape.seed)
    out: list[Arrival] = []
    for step, rate in enumerate(shape.rates):
        at = step * shape.step_s + rng.expovariate(rate)
        while at < (step + 1) * shape.step_s:
            length = rng.randint(shape.question_tokens * 3 // 4, shape.question_tokens * 5 // 4)
            question = " ".join(rng.choice(WORDS) for _ in range(length))
            out.append(Arrival(round(at, 3), step, rng.randrange(shape.customers), question))
            at += rng.expovariate(rate)
    return out


def system_prompt(shape: Shape, customer: int, arm: int) -> str:
    """The customer's shared prompt, headed by the arm's number (no arm finds another's)."""
    rng = random.Random(shape.seed * 1000 + customer)
    words = " ".join(rng.choice(WORDS) for _ in range(shape.prefix_tokens - 8))
    return f"Run {arm} customer {customer}: {words}"
