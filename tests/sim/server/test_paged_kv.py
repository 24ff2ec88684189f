"""The simulated engine's paged KV cache: vLLM's prefix caching in its free blocks, and the
KV events it publishes as its cache changes."""

from __future__ import annotations

from engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from sim.server.model import EngineAdmission
from sim.server.paged_kv import PagedKvCache, PromptPlan

BLOCK = 4


def plan(*blocks: int, own: int = 2) -> PromptPlan:
    """A prompt of full blocks named by their hashes (ids: the hash repeated)."""
    ids = [b for b in blocks for _ in range(BLOCK)]
    return PromptPlan(tuple(blocks), ids, own)


def submit(kv: PagedKvCache, request_id: str, prompt: PromptPlan) -> EngineAdmission:
    kv.plan(request_id, prompt)
    return kv.submit(request_id, 0)


def test_a_prompt_hits_the_blocks_an_earlier_one_left_and_stores_only_the_rest() -> None:
    kv = PagedKvCache(100 * BLOCK, BLOCK)
    assert submit(kv, "a", plan(1, 2, 3)) is EngineAdmission.ADMITTED
    assert kv.hit_tokens("a") == 0
    assert kv.drain_events() == [BlockStored((1, 2, 3), None, (1,) * 4 + (2,) * 4 + (3,) * 4, 4)]
    kv.release("a")
    assert submit(kv, "b", plan(1, 2, 7, 8)) is EngineAdmission.ADMITTED
    assert kv.hit_tokens("b") == 2 * BLOCK
    (stored,) = kv.drain_events()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (7, 8) and stored.parent_block_hash == 2
    assert stored.token_ids == (7,) * 4 + (8,) * 4


def test_running_requests_share_their_prefix_blocks() -> None:
    kv = PagedKvCache(100 * BLOCK, BLOCK)
    submit(kv, "a", plan(1, 2, 3, own=BLOCK))
    submit(kv, "b", plan(1, 2, 4, own=BLOCK))
    # Blocks 1, 2 once, 3 and 4, and one block of its own each.
    assert kv.used_tokens == 6 * BLOCK
    kv.release("a")
    assert kv.used_tokens == 4 * BLOCK  # 3 is cached, evictable: free KV
    assert kv.cached_blocks == 4


def test_running_requests_push_the_least_recently_used_prefix_out_tail_first() -> None:
    kv = PagedKvCache(6 * BLOCK, BLOCK)
    submit(kv, "a", plan(1, 2, 3, own=BLOCK))
    kv.release("a")
    kv.drain_events()
    # Needs four blocks: one of the cache's three goes, the prompt's deepest first.
    assert submit(kv, "b", plan(9, 8, 7, own=BLOCK)) is EngineAdmission.ADMITTED
    assert kv.drain_events()[0] == BlockRemoved((3,))
    assert kv.cached_prefix((1, 2, 3)) == 2
    # Held blocks are never evicted: a request that needs them waits.
    assert submit(kv, "c", plan(5, 6, 4, own=BLOCK)) is EngineAdmission.QUEUED
    assert kv.release("b") == ["c"]
    # Room for c: the oldest first (1, 2), then b's deepest block.
    assert kv.cached_prefix((1, 2)) == 0
    assert kv.cached_prefix((9, 8, 7)) == 2
    assert kv.cached_prefix((5, 6, 4)) == 3


def test_a_hit_on_evictable_blocks_keeps_them_when_making_room() -> None:
    kv = PagedKvCache(5 * BLOCK, BLOCK)
    submit(kv, "a", plan(1, 2, 3, own=BLOCK))
    kv.release("a")
    assert submit(kv, "b", plan(1, 2, 3, 4, own=BLOCK)) is EngineAdmission.ADMITTED
    assert kv.hit_tokens("b") == 3 * BLOCK
    # Two new blocks needed beside the three it holds again: nothing else to evict.
    assert submit(kv, "c", plan(5, own=BLOCK)) is EngineAdmission.QUEUED


def test_clear_publishes_all_blocks_cleared_and_empties_the_cache() -> None:
    kv = PagedKvCache(100 * BLOCK, BLOCK)
    submit(kv, "a", plan(1, 2))
    kv.release("a")
    kv.drain_events()
    kv.clear()
    assert kv.drain_events() == [AllBlocksCleared()]
    assert kv.cached_prefix((1, 2)) == 0


def test_a_prompt_larger_than_the_cache_is_refused() -> None:
    kv = PagedKvCache(3 * BLOCK, BLOCK)
    assert submit(kv, "a", plan(1, 2, 3, own=1)) is EngineAdmission.REJECTED_TOO_LARGE
    assert kv.release("a") == []
    assert submit(kv, "b", plan(1, own=1)) is EngineAdmission.ADMITTED
    assert kv.used_tokens == 2 * BLOCK
