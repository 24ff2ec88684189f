"""Workloads whose prompts share prefixes, as arrivals with their own texts.

What lives here: `Load` (who sends and how much), `chat_arrivals` (multi-turn chats: each
turn resends the system prompt and the whole history, as OpenAI clients do),
`rag_arrivals` (one long shared system prompt per application and a short question each)
and `mix_arrivals` (the field's 70% 4k / 25% 8k / 5% 32k, nothing shared). Texts are made
of pseudo-words drawn from a seeded generator and counted once with the sidecar's own
counter (sim.server.tokenizer.shared_bpe), so the sidecar and the simulated engines'
prefix caches (by message) see what a real client sends. Reproducible for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from policy.domain import ApiKey
from sim.fleet.arrivals import Arrival
from sim.fleet.prompts import library
from sim.server.tokenizer import shared_bpe

_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vu", "po", "der", "sil", "an", "ot", "ble", "qui")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(
        "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(count)
    )


def _text(rng: random.Random, tokens: int) -> tuple[str, int]:
    """A text of about `tokens` tokens, and its exact count."""
    text = _words(rng, max(1, tokens * 2 // 3))
    return text, shared_bpe().count(text)


@dataclass(frozen=True, slots=True)
class Load:
    """Who sends and how much: `keys`, each sending its share (`shares`) of about
    `rate_per_s` requests a second, starting as a Poisson process until `duration_s`;
    reproducible for `seed`."""

    keys: Sequence[ApiKey]
    shares: Sequence[float]
    rate_per_s: float
    duration_s: float
    seed: int

    def starts(self, draws: np.random.Generator, per_start: int = 1) -> Iterator[float]:
        """The start times, each of `per_start` requests (a chat's turns)."""
        at_s = 0.0
        while True:
            at_s += float(draws.exponential(per_start / self.rate_per_s))
            if at_s >= self.duration_s:
                return
            yield at_s

    def key(self, draws: np.random.Generator) -> ApiKey:
        """A caller, drawn by the keys' shares."""
        draw = float(draws.random())
        return self.keys[int(np.searchsorted(np.cumsum(self.shares), draw * sum(self.shares)))]


def chat_arrivals(
    load: Load,
    turns: int = 4,
    think_s: float = 8.0,
    systems: int = 4,
    system_tokens: int = 800,
    max_tokens: int = 256,
) -> list[Arrival]:
    """Chats of `turns` turns starting at rate_per_s / turns (about rate_per_s requests a
    second in all), one of `systems` system prompts each, a turn every ~`think_s`."""
    rng = random.Random(load.seed)
    draws = np.random.default_rng(load.seed)
    prompts = [_text(rng, system_tokens) for _ in range(systems)]
    arrivals: list[Arrival] = []
    for at_s in load.starts(draws, per_start=turns):
        key = load.key(draws)
        history = [prompts[rng.randrange(systems)]]
        when = at_s
        for _ in range(turns):
            history.append(_text(rng, rng.randint(40, 200)))  # the user's next question
            if when < load.duration_s:
                arrivals.append(
                    Arrival(
                        when,
                        key,
                        sum(n for _, n in history),
                        max_tokens,
                        texts=tuple(t for t, _ in history),
                        text_tokens=tuple(n for _, n in history),
                        conversation_texts=2,
                        roles=(
                            "system",
                            *(("user", "assistant")[i % 2] for i in range(len(history) - 1)),
                        ),
                    )
                )
            history.append(_text(rng, rng.randint(80, max_tokens)))  # the answer it got
            when += float(draws.exponential(think_s)) + 1.0
    arrivals.sort(key=lambda a: a.at_s)
    return arrivals


def rag_arrivals(
    load: Load, systems: int = 2, system_tokens: int = 2000, max_tokens: int = 256
) -> list[Arrival]:
    """One question each, behind one of `systems` long shared system prompts (retrieved
    context an application sends with every question)."""
    rng = random.Random(load.seed)
    draws = np.random.default_rng(load.seed)
    prompts = [_text(rng, system_tokens) for _ in range(systems)]
    arrivals: list[Arrival] = []
    for at_s in load.starts(draws):
        system = prompts[rng.randrange(systems)]
        question = _text(rng, rng.randint(50, 300))
        arrivals.append(
            Arrival(
                at_s,
                load.key(draws),
                system[1] + question[1],
                max_tokens,
                texts=(system[0], question[0]),
                text_tokens=(system[1], question[1]),
                conversation_texts=2,
                roles=("system", "user"),
            )
        )
    return arrivals


def mix_arrivals(load: Load, max_tokens: int = 512) -> list[Arrival]:
    """The field's mix: 70% ~4k, 25% ~8k, 5% ~32k prompts, nothing shared: the prompt
    library's texts behind a first line of the request's own (so no two prompts share a
    prefix, in the engines' caches or in the picker's index)."""
    draws = np.random.default_rng(load.seed)
    arrivals: list[Arrival] = []
    for count, at_s in enumerate(load.starts(draws), start=1):
        size = float(draws.random())
        low, high = (2048, 4000) if size < 0.70 else (4097, 7900) if size < 0.95 else (8193, 31000)
        chunks = library(False).messages(int(draws.integers(low, high)))
        texts = (f"request {count} of the field mix.", *chunks)
        tokens = tuple(_count(text) for text in texts)
        key = load.key(draws)
        arrivals.append(
            Arrival(
                at_s,
                key,
                sum(tokens),
                max_tokens,
                texts=texts,
                text_tokens=tokens,
            )
        )
    return arrivals


@cache
def _count(text: str) -> int:
    return shared_bpe().count(text)
