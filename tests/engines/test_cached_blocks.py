"""engines.cached_blocks: events translated into slogate's keys, longest prefixes, bounds."""

from __future__ import annotations

import tracemalloc

import numpy as np

from engines.cached_blocks import CachedBlocks, block_keys
from engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

IDS = np.arange(1000, 1000 + 16 * 12, dtype=np.int64)


def stored(hashes: tuple[int, ...], parent: int | None, start: int, **fields: object) -> EventBatch:
    tokens = tuple(int(t) for t in IDS[start * 16 : (start + len(hashes)) * 16])
    return EventBatch(0.0, (BlockStored(hashes, parent, tokens, 16, **fields),))  # type: ignore[arg-type]


def test_translated_events_meet_the_prompts_keys() -> None:
    index = CachedBlocks(max_blocks=100)
    index.apply(0, stored((11, 12, 13), None, 0))
    index.apply(0, stored((14, 15), 13, 3))  # continued from its parent, in another batch
    index.apply(1, stored((11,), None, 0))
    keys = block_keys(IDS, 16)
    assert index.matched_tokens(keys, [0, 1, 2]) == [80, 16, 0]
    assert index.publishes(0) and not index.publishes(2)
    # Another prompt sharing only the first block.
    other = IDS.copy()
    other[20] += 1
    assert index.matched_tokens(block_keys(other, 16), [0, 1]) == [16, 16]


def test_a_partial_last_block_is_not_a_block() -> None:
    assert block_keys(IDS[:47], 16).shape == (2,)
    assert block_keys(IDS[:15], 16).shape == (0,)


def test_removed_and_cleared() -> None:
    index = CachedBlocks(max_blocks=100)
    index.apply(0, stored((11, 12, 13), None, 0))
    index.apply(0, EventBatch(0.0, (BlockRemoved((13,)),)))
    keys = block_keys(IDS, 16)
    assert index.matched_tokens(keys, [0]) == [32]
    index.apply(0, EventBatch(0.0, (BlockRemoved((12,), medium="CPU"),)))  # not the GPU's
    assert index.matched_tokens(keys, [0]) == [32]
    index.apply(0, EventBatch(0.0, (AllBlocksCleared(),)))
    assert index.matched_tokens(keys, [0]) == [0]
    assert index.publishes(0)
    index.forget(0)
    assert not index.publishes(0) and index.total_blocks() == 0


def test_a_gap_is_dropped_and_counted() -> None:
    index = CachedBlocks(max_blocks=100)
    index.apply(0, stored((14, 15), 13, 3))  # its parent never seen
    assert index.counts[0].gaps == 2 and index.blocks(0) == 0


def test_keyed_and_other_tiers_are_ignored() -> None:
    index = CachedBlocks(max_blocks=100)
    index.apply(0, stored((11,), None, 0, keyed=True))
    index.apply(0, stored((21,), None, 0, medium="CPU"))
    assert index.blocks(0) == 0 and index.counts[0].ignored == 2


def test_the_cap_evicts_the_oldest() -> None:
    index = CachedBlocks(max_blocks=4)
    index.apply(0, stored(tuple(range(100, 106)), None, 0))
    assert index.blocks(0) == 4 and index.counts[0].evicted == 2
    # The first two blocks went: no prefix left to match from the start.
    assert index.matched_tokens(block_keys(IDS, 16), [0]) == [0]


def test_bytes_per_block() -> None:
    """The docstring's memory figure: per block, first engine and each further engine."""
    count = 20_000
    ids = np.arange(count * 16, dtype=np.int64) % 50_000
    tokens = tuple(int(t) for t in ids)
    event = BlockStored(tuple(range(1, count + 1)), None, tokens, 16)
    index = CachedBlocks(max_blocks=count)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index.apply(0, EventBatch(0.0, (event,)))
    first = (tracemalloc.get_traced_memory()[0] - before) / count
    index.apply(1, EventBatch(0.0, (event,)))
    second = (tracemalloc.get_traced_memory()[0] - before) / count - first
    tracemalloc.stop()
    print(f"bytes per block: first engine {first:.0f}, each further {second:.0f}")
    assert first < 200 and second < 120
