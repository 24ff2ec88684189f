"""A chat as a simulated engine with a paged KV cache tokenizes and names it. Pure (but for
the tokenizer, loaded once per process).

What lives here: `chat_ids` (a chat rendered with the model's template, then tokenized
whole by the DeepSeek tokenizer: the ids vLLM would hash; the sidecar's request path makes
its own apart, extproc.request.tokens.templated), `engine_block_hashes` (the engine's names
for its full blocks) and `prompt_plan` (sim.server.paged_kv's `PromptPlan` of them). The
offline fleet (sim.fleet) and the HTTP pool (sim.server._serving) both use them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from extproc.request.tokens.prompt import IdCounter
from extproc.request.tokens.templated import render
from policy.domain import ChatTemplate
from sim.server.paged_kv import PromptPlan
from sim.server.tokenizer import shared_bpe

_NONE_HASH = hashlib.sha256(b"slogate simulated engine").digest()  # the chain's seed


def chat_ids(
    roles: Sequence[str], texts: Sequence[str], template: ChatTemplate = ChatTemplate.DEEPSEEK
) -> np.ndarray:
    """The chat's token ids as the engine makes them: rendered with its template and
    tokenized whole (as vLLM does)."""
    counter = shared_bpe()
    assert isinstance(counter, IdCounter)
    return counter.token_ids(render(template, roles, texts))


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


def prompt_plan(ids: np.ndarray, block_size: int, output_tokens: int) -> PromptPlan:
    """A prompt of `ids` as a paged engine holds it: its full blocks' names and ids, and the
    tokens past them (the last partial block, and the `output_tokens` it generates)."""
    full = int(ids.shape[0]) // block_size
    blocked = ids[: full * block_size]
    hashes = tuple(engine_block_hashes(blocked, block_size))
    own = int(ids.shape[0]) - full * block_size + output_tokens
    return PromptPlan(hashes, blocked.tolist(), own)
