"""What a simulated engine with a paged KV cache is told of a request: its prompt's token
ids, cut into full blocks and named by a chained hash as vLLM names them.

What lives here: `prompt_ids` (an arrival's chat as the engine tokenizes it: its template
rendered, then the DeepSeek tokenizer the sidecar's counter uses), `engine_block_hashes`
(the engine's names for its blocks) and `prompt_plan` (both as sim.server.paged_kv's
`PromptPlan`). The engine's own ids, made apart from the sidecar's: where the request path
builds the same ones, the picker's exact index matches the engine's blocks.
"""

from __future__ import annotations

import hashlib

import numpy as np

from extproc.request.tokens.prompt import IdCounter
from extproc.request.tokens.templated import render
from policy.domain import ChatTemplate
from sim.fleet.arrivals import Arrival
from sim.fleet.prompts import library
from sim.server.paged_kv import PromptPlan
from sim.server.tokenizer import shared_bpe

_NONE_HASH = hashlib.sha256(b"slogate simulated engine").digest()  # the chain's seed


def engine_block_hashes(ids: np.ndarray, block_size: int) -> list[int]:
    """The simulated engine's names for the full blocks of `ids`: chained as vLLM chains
    them (each block's sha256 over its parent's digest and its own tokens, published as the
    digest's last 8 bytes), over the ids' bytes rather than vLLM's pickled tuples
    (engines.block_hashes computes those, ~3 us a block: too slow for a study's 10^5
    prompts). The picker's index learns a block from the event's token ids and parent,
    never from its name (engines.cached_blocks), so any chained names serve."""
    hashes: list[int] = []
    parent = _NONE_HASH
    data = ids.astype("<u4").tobytes()
    step = block_size * 4
    for start in range(0, (int(ids.shape[0]) // block_size) * step, step):
        parent = hashlib.sha256(parent + data[start : start + step]).digest()
        hashes.append(int.from_bytes(parent[-8:], "big"))
    return hashes


def prompt_ids(arrival: Arrival, template: ChatTemplate = ChatTemplate.DEEPSEEK) -> np.ndarray:
    """The prompt's token ids as the engine makes them: its chat rendered with the model's
    template and tokenized whole (as vLLM does, and as the sidecar's request path does for a
    pool that follows KV events: extproc.request.tokens.templated)."""
    texts = arrival.texts or library(arrival.crafted).messages(arrival.counted)
    counter = shared_bpe()
    assert isinstance(counter, IdCounter)
    return counter.token_ids(render(template, arrival.chat_roles(len(texts)), texts))


def prompt_plan(arrival: Arrival, output_tokens: int, block_size: int) -> PromptPlan:
    """The request as a paged engine holds it: its prompt's full blocks' hashes and ids, and
    the tokens past them (the last partial block, and what it generates)."""
    ids = prompt_ids(arrival)
    full = ids.shape[0] // block_size
    blocked = ids[: full * block_size]
    hashes = tuple(engine_block_hashes(blocked, block_size))
    own = int(ids.shape[0]) - full * block_size + output_tokens
    return PromptPlan(hashes, blocked.tolist(), own)
