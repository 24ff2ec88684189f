"""What a simulated engine with a paged KV cache is told of a request: its prompt's token
ids, cut into full blocks and hashed as the engine hashes them.

What lives here: `prompt_ids` (an arrival's texts as the token ids the sidecar's counter
gives for them, one text after another: the ids the sidecar hashes the prompt from) and
`prompt_plan` (those ids as sim.server.paged_kv's `PromptPlan`).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from extproc.request.tokens.prompt import IdCounter
from sim.fleet.arrivals import Arrival
from sim.fleet.prompts import library
from sim.server.paged_kv import PromptPlan
from sim.server.tokenizer import shared_bpe

_NONE_HASH = hashlib.sha256(b"slogate simulated engine").digest()  # the chain's seed


@lru_cache(maxsize=4096)
def _text_ids(text: str) -> np.ndarray:
    counter = shared_bpe()
    assert isinstance(counter, IdCounter)
    ids = counter.token_ids(text)
    ids.flags.writeable = False  # shared by every prompt that carries the text
    return ids


def engine_block_hashes(ids: np.ndarray, block_size: int) -> list[int]:
    """The engine's names for the full blocks of `ids`, chained as vLLM chains them (each
    block's sha256 over its parent's and its own tokens, read as an int from its last 8
    bytes, as an engine that publishes int hashes does). Not slogate's keys: the picker's
    index learns the blocks from the events' token ids (engines.cached_blocks)."""
    hashes: list[int] = []
    parent = _NONE_HASH
    data = ids.astype("<u4").tobytes()
    step = block_size * 4
    for start in range(0, (ids.shape[0] // block_size) * step, step):
        parent = hashlib.sha256(parent + data[start : start + step]).digest()
        hashes.append(int.from_bytes(parent[-8:], "big"))
    return hashes


def prompt_ids(arrival: Arrival) -> np.ndarray:
    """The prompt's token ids, its texts' one after another."""
    texts = arrival.texts or library(arrival.crafted).messages(arrival.counted)
    return np.concatenate([_text_ids(text) for text in texts])


def prompt_plan(arrival: Arrival, output_tokens: int, block_size: int) -> PromptPlan:
    """The request as a paged engine holds it: its prompt's full blocks' hashes and ids, and
    the tokens past them (the last partial block, and what it generates)."""
    ids = prompt_ids(arrival)
    full = ids.shape[0] // block_size
    hashes = tuple(engine_block_hashes(ids[: full * block_size], block_size))
    own = arrival.prompt_tokens - full * block_size + output_tokens
    return PromptPlan(hashes, ids[: full * block_size].tolist(), max(own, output_tokens))
