"""Prompt prefixes as hashes, and an approximate, bounded index of who served which. Pure.

What lives here: `text_blocks` (one text's token ids -> a running hash per block of
`block_tokens` ids), `PromptBlocks` (a whole prompt's prefix hashes at a ladder of block
positions, and its conversation key) and `PrefixIndex` (per pool: prefix hash -> the
engines that recently served a prompt with that prefix, least recently used first out).

Why a ladder: an engine's prefix cache hits the leading blocks two prompts share. Keeping
every block's hash of every prompt would cost the index one entry per 64 tokens; keeping
the hashes at blocks 0-7 and then every ~25% further (plus the last) costs ~25 entries for
a 32k-token prompt and measures a shared prefix to within a quarter of its length — what a
score needs. Hashes are running: a block's hash depends on every token before it, so two
prompts agree at a position exactly when their whole prefixes up to it agree (up to 64-bit
collisions). Each message's blocks are hashed on its own (so a message counted before can
keep its hashes beside its count) and chained to the prompt's earlier messages.

The conversation key is the prefix hash through the conversation's head (the system
prompt, the tools and the first user message, `InferenceRequest.conversation_texts`): every
turn of a chat resends it, so every replica maps every turn to the same key.

Memory: the index holds at most `entries` hashes per pool (an int key and an int bitmask of
engine slots in an OrderedDict: ~150 bytes each, measured in bench decision-cost).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

_U64 = np.uint64
_RNG = np.random.default_rng(0x5106A7E)
_MAX_BLOCK_TOKENS = 4096
# Per position inside a block, and per block index inside a text: random odd multipliers.
# (32-bit inside a block: a wrapping uint32 matrix product is the cheapest pass over every
# id, ~15 us for 32k tokens; the block sums are widened and mixed to 64 bits after.)
_IN_BLOCK = (_RNG.integers(1, 2**31, size=_MAX_BLOCK_TOKENS, dtype=np.uint64) | _U64(1)).astype(
    np.uint32
)
_PER_BLOCK = _RNG.integers(1, 2**63, size=1 << 16, dtype=np.uint64) | _U64(1)
_PER_BLOCK_INT = int(_PER_BLOCK[0])
_MIX_INT = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_SEED = 0x243F6A8885A308D3
# A 0-d array, not a numpy scalar: array + 0-d array skips the scalar's own dispatch.
_SEED_ARRAY = np.array(_SEED, dtype=np.uint64)


def text_blocks(ids: np.ndarray, block_tokens: int) -> np.ndarray:
    """Running hashes of one text's blocks of token ids (the last block may be short):
    entry j depends on blocks 0..j of this text. uint64, one per block."""
    n = int(ids.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if block_tokens > _MAX_BLOCK_TOKENS:
        raise ValueError(f"block_tokens above {_MAX_BLOCK_TOKENS}")
    values = ids if ids.dtype == np.uint32 else ids.astype(np.uint32)
    weights = _IN_BLOCK[:block_tokens]
    if n < block_tokens:  # one short block (most chat messages): no array arithmetic to pay for
        value = (int(values @ weights[:n]) + n) * _PER_BLOCK_INT & _MASK
        return np.array([value], dtype=np.uint64)
    full = n // block_tokens
    tail = n - full * block_tokens
    blocks = np.empty(full + (1 if tail else 0), dtype=np.uint64)
    # Array arithmetic wraps silently (no np.errstate to pay ~2 us for: only numpy
    # scalars warn on overflow, and none is made here). einsum's plain loop: the same
    # wrapping sums as `@` (integer matmul has no BLAS), ~20% faster for these shapes.
    blocks[:full] = np.einsum(
        "ij,j->i",
        values[: full * block_tokens].reshape(full, block_tokens),
        weights,
        optimize=False,
    )
    if tail:
        blocks[full] = int(values[full * block_tokens :] @ weights[:tail]) + tail
    count = blocks.shape[0]
    per_block = (
        _PER_BLOCK[:count]
        if count <= _PER_BLOCK.shape[0]
        else np.resize(_PER_BLOCK, count) * _U64(3)
    )
    # Each block's weighted sum times its own odd multiplier, summed up to it: a running
    # hash in which a block's position and every block before it count.
    return np.add.accumulate(blocks * per_block)  # uint64 in, uint64 out: no dtype to cast


@lru_cache(maxsize=4096)
def ladder(count: int) -> tuple[int, ...]:
    """The block positions (0-based) a prompt of `count` blocks is indexed at (the same for
    every prompt of as many blocks: worked out once)."""
    positions = list(range(min(count, 8)))
    step = 8.0
    while True:
        step *= 1.25
        position = round(step) - 1
        if position >= count - 1:
            break
        positions.append(position)
    if count and positions[-1] != count - 1:
        positions.append(count - 1)
    return tuple(positions)


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's prefix hashes at its ladder positions, the tokens each covers, its
    conversation key (0: none) and the tokens of the conversation's head. `engine_ids`:
    the token ids the engine will see (after its chat template), where the request path
    built them for a pool whose engines publish KV events (engines.cached_blocks keys
    them); None otherwise."""

    hashes: tuple[int, ...]
    covered_tokens: tuple[int, ...]
    key: int
    total_tokens: int
    head_tokens: int = 0
    engine_ids: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def empty(self) -> bool:
        return not self.hashes


NO_BLOCKS = PromptBlocks((), (), 0, 0, 0)


def _mix_int(value: int) -> int:
    """`_mix` on one Python int (no array overhead for the chain's few scalars)."""
    value ^= value >> 31
    value = (value * _MIX_INT) & _MASK
    return value ^ (value >> 29)


def prompt_blocks(
    texts: Sequence[np.ndarray],
    lengths: Sequence[int],
    block_tokens: int,
    conversation_texts: int = 1,
) -> PromptBlocks:
    """Chain each text's block hashes (`text_blocks`) into the prompt's prefix hashes and
    keep them at the ladder positions. `lengths`: each text's token count (its blocks end
    at its own end, so the tokens a position covers are summed per text). The chain runs
    on Python ints, one step per text and one per ladder position: a chat's twenty
    messages would otherwise cost twenty rounds of array calls."""
    if len(texts) == 1:
        return _one_text(texts[0], lengths[0], block_tokens)
    counts = [int(blocks.shape[0]) for blocks in texts]
    total = sum(counts)
    if not total:
        return NO_BLOCKS
    seeds: list[int] = []
    starts: list[int] = []
    before: list[int] = []  # tokens ahead of each text
    seed, start, covered = _SEED, 0, 0
    key = head = 0
    for index, (blocks, length) in enumerate(zip(texts, lengths, strict=True)):
        seeds.append(seed)
        starts.append(start)
        before.append(covered)
        if counts[index]:
            seed = _mix_int((int(blocks[-1]) + seed) & _MASK)
        start += counts[index]
        covered += length
        if index + 1 == conversation_texts:
            key, head = seed, covered
    hashes: list[int] = []
    tokens: list[int] = []
    positions = ladder(total)
    text = i = 0
    while i < len(positions):  # the positions in one text at a time
        while starts[text] + counts[text] <= positions[i]:
            text += 1
        end = starts[text] + counts[text]
        j = i + 1
        while j < len(positions) and positions[j] < end:
            j += 1
        local = [position - starts[text] for position in positions[i:j]]
        # One gather for a long text's many positions (numpy scalars cost ~0.1 us each).
        values = (
            texts[text][local].tolist() if len(local) > 2 else [int(texts[text][b]) for b in local]
        )
        for block, value in zip(local, values, strict=True):
            hashes.append((value + seeds[text]) & _MASK)
            tokens.append(before[text] + min((block + 1) * block_tokens, lengths[text]))
        i = j
    return PromptBlocks(tuple(hashes), tuple(tokens), key or seed, covered, head or covered)


def _one_text(blocks: np.ndarray, length: int, block_tokens: int) -> PromptBlocks:
    """`prompt_blocks` of a prompt counted as one text (the usual case: the counter
    counts a chat's rendered prompt whole), the same hashes with the positions' gather and
    covered tokens worked out once per prompt size."""
    count = int(blocks.shape[0])
    if not count:
        return NO_BLOCKS
    key = _mix_int((int(blocks[-1]) + _SEED) & _MASK)
    gather, ends = _ladder_arrays(count, block_tokens)
    # Every position but the last ends inside the text (`ends` is increasing, and the text's
    # tokens fill all its blocks but the last): only the last one's end is cut at its length.
    if len(ends) > 1 and ends[-2] < length:
        covered = (*ends[:-1], min(ends[-1], length))
    else:
        covered = tuple(min(end, length) for end in ends)
    # The seed added in uint64 (wrapping: `(value + _SEED) & _MASK` bit for bit), one array
    # call instead of a Python add and mask per position on ints past 2**63 (~3 us).
    hashes = tuple((blocks[gather] + _SEED_ARRAY).tolist())
    return PromptBlocks(hashes, covered, key, length, length)


@lru_cache(maxsize=4096)
def _ladder_arrays(count: int, block_tokens: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A prompt of `count` blocks' ladder positions, as an index array for one gather, and
    each position's end in tokens when its blocks are full."""
    positions = ladder(count)
    gather = np.array(positions, dtype=np.intp)
    gather.flags.writeable = False
    return gather, tuple((position + 1) * block_tokens for position in positions)


class PrefixIndex:
    """One pool's recently served prefixes: hash -> bitmask of engine slots, LRU-bounded."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._seen: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def matched_tokens(self, blocks: PromptBlocks, slots: Sequence[int]) -> list[int]:
        """For each engine slot, the prompt tokens its deepest matching prefix covers: the
        longest run of ladder positions from the first that it served."""
        matched = [0] * len(slots)
        if not blocks.hashes:
            return matched
        alive = 0
        for slot in slots:
            alive |= 1 << slot
        served = self._seen.get
        if not alive & served(blocks.hashes[0], 0):  # no engine served its first block
            return matched
        covered = 0  # what the engines still alive matched, through the previous position
        for digest, through in zip(blocks.hashes, blocks.covered_tokens, strict=False):
            still = alive & served(digest, 0)
            if still != alive:  # some stop here: they matched through the previous one
                if covered:
                    _mark(matched, slots, alive & ~still, covered)
                alive = still
                if not alive:
                    return matched
            covered = through
        _mark(matched, slots, alive, covered)
        return matched

    def add(self, blocks: PromptBlocks, slot: int) -> None:
        """The engine at `slot` was sent this prompt: its prefix cache will hold it. The
        deepest positions go in first, so the shared shallow ones are the freshest."""
        seen = self._seen
        bit = 1 << slot
        take = seen.pop
        for digest in reversed(blocks.hashes):
            # Taken out and put back: at the end, the freshest, a new one alike.
            seen[digest] = take(digest, 0) | bit
        while len(seen) > self.entries:
            seen.popitem(last=False)

    def forget(self, slot: int) -> None:
        """An engine left (or restarted: its cache is empty): clear its bit everywhere."""
        keep = ~(1 << slot)
        for digest in list(self._seen):
            mask = self._seen[digest] & keep
            if mask:
                self._seen[digest] = mask
            else:
                del self._seen[digest]


def _mark(matched: list[int], slots: Sequence[int], mask: int, covered: int) -> None:
    for i, slot in enumerate(slots):
        if mask >> slot & 1:
            matched[i] = covered
