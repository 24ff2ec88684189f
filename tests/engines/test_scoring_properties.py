"""The picker's shortcuts against the rules they stand for (hypothesis): `pick` orders as the
scores rounded to 9 decimals, ties to the heavier rendezvous weight; `load_of` is the
largest of its parts; a prompt counted as one text has the chained hashes of the general
rule (engines.prefix)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.prefix import (
    _MASK,
    _SEED,
    PrefixIndex,
    PromptBlocks,
    ladder,
    prompt_blocks,
    text_blocks,
)
from engines.scoring import EngineCandidate, load_of, pick, rendezvous, score
from policy.schema import PickingConfig

# Few distinct values, so that totals tie and nearly tie (the rounding's and the weights'
# cases), and every bound is crossed.
Row = tuple[int, int, float | None, float | None, float | None, int, bool]
_held = st.integers(0, 4)
_row = st.tuples(
    _held,  # requests in flight
    st.sampled_from([0, 1000, 3000, 4000]),  # tokens held
    st.sampled_from([None, 4000.0, 10000.0]),  # its KV cache
    st.sampled_from([None, 4.0, 8.0]),  # its batch slots
    st.sampled_from([None, 0.0, 0.5, 0.3333333333333333, 1.0]),  # scraped KV usage
    st.sampled_from([0, 256, 512, 768]),  # matched tokens
    st.booleans(),  # an exact match
)


def _candidates(rows: list[Row]) -> list[EngineCandidate]:
    return [
        EngineCandidate(f"10.1.0.{i}:8000", i, tokens, held, kv, seqs, usage, matched, exact)
        for i, (held, tokens, kv, seqs, usage, matched, exact) in enumerate(rows)
    ]


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(_row, min_size=1, max_size=9),
    head=st.sampled_from([0, 256, 512]),
    extra=st.sampled_from([0, 256, 768]),
    key=st.sampled_from([0, 1, 2**63 + 5, 12345678901234567]),
    weights=st.tuples(
        st.sampled_from([2.0, 1.0, 0.0]),
        st.sampled_from([1.0, 0.0, 0.1]),
        st.sampled_from([1.0, 0.0, 0.3]),
        st.sampled_from([0.25, 0.0]),
    ),
    bound=st.sampled_from([1.25, 1.0, 2.0]),
    choices=st.integers(1, 3),
    bucket=st.sampled_from(["0-4k", "4k-8k"]),
)
def test_pick_orders_as_the_rounded_scores_and_the_weights(
    rows: list[Row],
    head: int,
    extra: int,
    key: int,
    weights: tuple[float, float, float, float],
    bound: float,
    choices: int,
    bucket: str,
) -> None:
    candidates = _candidates(rows)
    total = head + extra
    blocks = PromptBlocks((1,), (total,), key, total, head)
    prefix_w, load_w, affinity_w, length_w = weights
    config = PickingConfig(
        prefix_weight=prefix_w,
        load_weight=load_w,
        affinity_weight=affinity_w,
        length_weight=length_w,
        load_bound=bound,
        choices=choices,
    )
    scored = score(candidates, blocks, bucket, config)
    ranks = [(-round(s.total, 9), -rendezvous(key, s.address)) for s in scored]
    expected = [scored[i].address for i in sorted(range(len(ranks)), key=ranks.__getitem__)]
    assert pick(candidates, blocks, bucket, config) == expected[:choices]


@settings(max_examples=300, deadline=None)
@given(row=_row, pool_held=st.integers(0, 12), count=st.integers(1, 4), most=_held)
def test_the_load_is_the_largest_of_its_parts(
    row: Row, pool_held: int, count: int, most: int
) -> None:
    (candidate,) = _candidates([row])
    parts = [0.5 * candidate.held_sequences / most if most else 0.0]
    if candidate.kv_tokens:
        parts.append(candidate.held_tokens / candidate.kv_tokens)
    if candidate.sequences:
        parts.append(candidate.held_sequences / candidate.sequences)
    if len(parts) == 1:
        parts.append(candidate.held_sequences / (pool_held + count))
    if candidate.scraped_kv_usage is not None:
        parts.append(candidate.scraped_kv_usage)
    assert load_of(candidate, pool_held, count, most) == min(1.0, max(parts))


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 3000),
    block_tokens=st.sampled_from([4, 16, 64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_texts_hashes_are_the_general_chains(length: int, block_tokens: int, seed: int) -> None:
    ids = np.random.default_rng(seed).integers(0, 2**32, length, dtype=np.uint64)
    hashed = text_blocks(ids.astype(np.uint32), block_tokens)
    blocks = prompt_blocks([hashed], [length], block_tokens)
    # The general chain (prompt_blocks over several texts) for one text: each ladder
    # position's running hash plus the seed, wrapped to 64 bits.
    positions = ladder(int(hashed.shape[0]))
    assert blocks.hashes == tuple((int(hashed[p]) + _SEED) & _MASK for p in positions)
    assert blocks.covered_tokens == tuple(min((p + 1) * block_tokens, length) for p in positions)
    # An empty text ahead takes the general path: the same hashes.
    empty = np.zeros(0, dtype=np.uint64)
    assert prompt_blocks([empty, hashed], [0, length], block_tokens).hashes == blocks.hashes


def _matched_one_by_one(index: PrefixIndex, blocks: PromptBlocks, slots: list[int]) -> list[int]:
    """The rule `PrefixIndex.matched_tokens` follows, position by position."""
    matched = [0] * len(slots)
    alive = {slot for slot in slots}
    covered = 0
    for digest, through in zip(blocks.hashes, blocks.covered_tokens, strict=False):
        served = index._seen.get(digest, 0)
        for slot in [s for s in alive if not served >> s & 1]:
            matched[slots.index(slot)] = covered
            alive.discard(slot)
        covered = through
    for slot in alive:
        matched[slots.index(slot)] = covered
    return matched


@settings(max_examples=300, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    served=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5), st.integers(0, 60))),
    slots=st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True),
    entries=st.sampled_from([20, 1000]),
    forget=st.lists(st.integers(0, 5), max_size=2),
)
def test_matched_tokens_are_each_engines_longest_served_run(
    prompts: list[int],
    served: list[tuple[int, int, int]],
    slots: list[int],
    entries: int,
    forget: list[int],
) -> None:
    # Prompts that share their leading blocks (one shared text, cut at several lengths),
    # sent to engines in turn, some cut short; an LRU bound that drops some positions.
    shared = np.random.default_rng(7).integers(0, 50_000, 40 * 4).astype(np.uint32)
    ladders = [prompt_blocks([text_blocks(shared[: 4 * n], 4)], [4 * n], 4) for n in prompts]
    index = PrefixIndex(entries)
    for which, slot, cut in served:
        blocks = ladders[which % len(ladders)]
        index.add(
            PromptBlocks(blocks.hashes[cut % 7 :], blocks.covered_tokens[cut % 7 :], 1, 1), slot
        )
    for slot in forget:
        index.forget(slot)
    for blocks in ladders:
        assert index.matched_tokens(blocks, slots) == _matched_one_by_one(index, blocks, slots)
