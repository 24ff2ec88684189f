"""What the counter gives the engine picker: each text's token-block hashes beside the
count, the same count either way, kept with a cached message, cut texts joined back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from admission.decision import CountKind
from engines.prefix import prompt_blocks, text_blocks
from extproc.request.tokens.native import exact_counter
from extproc.request.tokens.prompt import PromptCounter
from policy.schema import CountingConfig

TEXTS = (
    "You are a careful assistant. " * 40,
    "What does the fleet do when a pool's engine dies? " * 10,
    "short",
)


@pytest.fixture(scope="module", params=["fastokens", "tiktoken"])
def counter(request: pytest.FixtureRequest) -> object:
    return exact_counter(request.param)


async def test_blocks_come_with_the_same_count(counter: object) -> None:
    plain = await PromptCounter(counter, CountingConfig()).count(TEXTS)  # type: ignore[arg-type]
    with_blocks = await PromptCounter(counter, CountingConfig()).count(TEXTS, 0, 64)  # type: ignore[arg-type]
    assert plain.tokens == with_blocks.tokens and plain.blocks is None
    assert with_blocks.blocks is not None and with_blocks.lengths is not None
    for text, blocks, length in zip(TEXTS, with_blocks.blocks, with_blocks.lengths, strict=True):
        ids = counter.token_ids(text)  # type: ignore[attr-defined]
        assert length == len(ids) == counter.count(text)  # type: ignore[attr-defined]
        assert np.array_equal(blocks, text_blocks(ids, 64))


async def test_a_cached_message_keeps_its_blocks_and_a_bound_has_none(counter: object) -> None:
    prompts = PromptCounter(counter, CountingConfig())  # type: ignore[arg-type]
    first = await prompts.count(TEXTS, 0, 64)
    again = await prompts.count(TEXTS[:2], 0, 64)
    assert again.kind is CountKind.CACHED and again.blocks is not None
    assert first.blocks is not None
    assert [b.tolist() for b in again.blocks] == [b.tolist() for b in first.blocks[:2]]
    tight = PromptCounter(counter, CountingConfig(max_bytes=100))  # type: ignore[arg-type]
    bound = await tight.count(TEXTS, 0, 64)
    assert bound.kind is CountKind.BOUND and bound.blocks is None


async def test_a_text_cut_across_the_workers_hashes_as_one() -> None:
    counter = exact_counter("tiktoken")  # the engine that cuts long texts
    long_text = "The pool's engines share one prefix of many words, " * 2000
    config = CountingConfig(inline_max_bytes=0, inline_unicode_max_bytes=0, split_min_bytes=1024)
    with ThreadPoolExecutor(2) as executor:
        cut = await PromptCounter(counter, config, executor).count((long_text,), 0, 64)
    whole = await PromptCounter(counter, CountingConfig()).count((long_text,), 0, 64)
    assert cut.blocks is not None and whole.blocks is not None
    assert cut.tokens == whole.tokens
    assert np.array_equal(cut.blocks[0], whole.blocks[0])
    blocks = prompt_blocks(cut.blocks, cut.lengths or (), 64)
    assert blocks.total_tokens == whole.lengths[0]  # type: ignore[index]
