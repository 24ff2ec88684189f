"""Prompt texts for simulated arrivals, so the simulator counts them with the sidecar's
own counter (extproc.request.tokens) instead of taking their size on trust.

What lives here: `PromptLibrary`, a set of message texts whose DeepSeek token counts are
(about: within a token or two) powers of two, 64 ... 131072, natural-looking words or
crafted random letters, built once per process with the real BPE; `messages` composes a
prompt of any size from them (its binary digits), so a prompt of N tokens costs the counter
what N tokens cost it, and the counter's per-message cache sees what a chat's history looks
like: the same texts again. What the counter returns is the real count of those texts plus
the chat template's overhead per message, exactly what the sidecar would decide on.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from functools import cache

from extproc.request.tokens.prompt import TokenCounter
from sim.server.tokenizer import shared_bpe

SMALLEST = 64  # tokens: prompts are composed in steps of this
LARGEST_POWER = 17  # 2**17 = 131072 tokens
# Words both tokenizers keep whole (the tiny vLLM model's was trained on them too).
WORDS = (
    "the",
    "fleet",
    "serves",
    "tokens",
    "under",
    "load",
    "while",
    "budgets",
    "hold",
    "and",
    "breakers",
    "watch",
    "the",
    "tail",
    "latency",
    "so",
    "every",
    "tenant",
    "keeps",
    "its",
    "service",
    "level",
    "objective",
    "across",
    "pools",
    "of",
    "engines",
    "that",
    "share",
    "one",
    "cache",
    "of",
    "keys",
    "and",
    "values",
    "per",
    "request",
    "routed",
    "by",
    "context",
    "length",
)


def _grow(bpe: TokenCounter, next_piece: Callable[[], str], tokens: int) -> str:
    """A prefix of pieces from `next_piece()` of about `tokens` tokens (binary search on
    its length: a text's prefixes never count more tokens than the text)."""
    pieces = [next_piece() for _ in range(8)]
    sample = "".join(pieces)
    chars_per_token = len(sample) / max(1, bpe.count(sample))
    text = sample
    while len(text) < tokens * chars_per_token * 1.5 + 64:
        text += next_piece()
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if bpe.count(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


class PromptLibrary:
    def __init__(self, bpe: TokenCounter, crafted: bool) -> None:
        rng = random.Random(f"slogate-sim-{'crafted' if crafted else 'natural'}")

        def piece() -> str:
            if crafted:  # random letters: what fooled the fitted estimate tenfold
                return "".join(rng.choice(string.ascii_letters) for _ in range(64))
            return " " + " ".join(rng.choice(WORDS) for _ in range(16))

        # Each chunk drawn afresh: none is another repeated, so the counter's cache (and
        # an engine's prefix cache) tell them apart.
        self.chunks = {
            1 << power: _grow(bpe, piece, 1 << power) for power in range(6, LARGEST_POWER + 1)
        }

    def messages(self, tokens: int) -> tuple[str, ...]:
        """Message texts totalling about `tokens` tokens (rounded up to SMALLEST)."""
        units = max(1, -(-tokens // SMALLEST))
        texts = []
        for power in range(LARGEST_POWER, 5, -1):
            size = 1 << power
            while units * SMALLEST >= size and size in self.chunks:
                texts.append(self.chunks[size])
                units -= size // SMALLEST
        return tuple(texts)


@cache
def library(crafted: bool) -> PromptLibrary:
    """Built once per process (a few seconds each): every simulated run shares it."""
    return PromptLibrary(shared_bpe(), crafted)
