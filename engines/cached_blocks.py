"""What each engine's prefix cache holds, exactly, from the KV events it publishes. Pure.

What lives here: `block_keys` (a templated prompt's token ids -> one running key per full
engine block) and `CachedBlocks` (one pool's exact index: per engine slot, the blocks its
events say it holds; the longest cached prefix of a prompt on each engine).

Two hash spaces. The engine names a block by its own hash (sha256 of the parent's hash and
the block's tokens, chained from a seed, `--prefix-caching-hash-algo`; engines.block_hashes
computes it). slogate keys a block in a space of its own: a running 64-bit hash of the
token ids up to the block's end, in blocks of the engine's `block_size` — the style of
engines.prefix.text_blocks, one uint32 matrix product and one cumulative sum over the
prompt (~15 us for 32k tokens, where the engine's sha256 over pickled tuples costs one
hash call per block: ~2,000 for a 32k prompt at 16 tokens a block). Each `BlockStored` is
translated into this space from its token ids and its parent's key (so every event's
parent must have been seen: a stored block whose parent is unknown is a gap and is
dropped, counted). This needs no hash configuration and works with engines whose seed is
random per process (vLLM's xxhash without PYTHONHASHSEED). Collisions: a block's 32-bit
weighted sum is what tells two blocks apart at one position (two different blocks agree
with probability ~2^-32); the chain itself is 64 bits.

Kept: blocks on the engine's GPU (medium None or "GPU"), of its first KV cache group, and
not keyed by anything but tokens (no LoRA, multimodal inputs or cache salt: a plain
prompt's keys would never meet them). Others are ignored, counted.

Longest prefix: the engine's prefix cache hits the leading blocks a prompt shares with it,
and vLLM frees a request's blocks tail first, so what an engine holds of one prompt is a
prefix; the longest is found by binary search over the prompt's keys (~11 lookups per
engine for 2,000 blocks), once the first block is known held. Where what is held is not a
prefix (the cap below evicted from the middle), the search may overstate the match.

Memory: per engine slot at most `max_blocks` blocks (a policy cap; set it at or above the
engine's KV blocks so nothing the engine holds is evicted here). Each costs one entry in
the slot's map (engine hash -> key and depth) and a share of one in the pool's map
(key -> bitmask of slots): ~130 bytes for the first engine holding a block, ~70 for each
further one (measured in tests/engines/test_cached_blocks.py). Over the cap, the slot's
oldest block goes first (counted as evicted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

_U64 = np.uint64
_RNG = np.random.default_rng(0x6B765F626C6B)
MAX_BLOCK_SIZE = 4096
MAX_DEPTH = 1 << 17  # blocks: 2M tokens at 16 a block; a prompt's keys stop there
# Per position inside a block: random odd 32-bit multipliers; per block depth: random odd 64-bit.
_IN_BLOCK = (_RNG.integers(1, 2**31, size=MAX_BLOCK_SIZE, dtype=np.uint64) | _U64(1)).astype(
    np.uint32
)
_PER_DEPTH = _RNG.integers(1, 2**63, size=MAX_DEPTH, dtype=np.uint64) | _U64(1)
_MASK = (1 << 64) - 1
_GPU = (None, "GPU")


def block_keys(ids: np.ndarray, block_size: int) -> np.ndarray:
    """The running keys of the full blocks of `block_size` ids (the tokens after a partial
    last block are not a block the engine caches): uint64, entry j covers ids[:(j+1)*bs]."""
    if not 0 < block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be within 1..{MAX_BLOCK_SIZE}")
    full = min(int(ids.shape[0]) // block_size, MAX_DEPTH)
    if not full:
        return np.zeros(0, dtype=np.uint64)
    values = ids[: full * block_size]
    if values.dtype != np.uint32:
        values = values.astype(np.uint32)
    with np.errstate(over="ignore"):
        sums = (values.reshape(full, block_size) @ _IN_BLOCK[:block_size]).astype(np.uint64)
        return np.cumsum(sums * _PER_DEPTH[:full], dtype=np.uint64)


def _stored_keys(parent_key: int, depth: int, tokens: np.ndarray, block_size: int) -> list[int]:
    """The keys of blocks stored after a parent at `depth` (0: none) whose key is
    `parent_key`: the continuation of `block_keys` over the same ids."""
    count = int(tokens.shape[0]) // block_size
    if depth + count > MAX_DEPTH:
        count = max(0, MAX_DEPTH - depth)
    if not count:
        return []
    with np.errstate(over="ignore"):
        sums = (
            tokens[: count * block_size].reshape(count, block_size) @ _IN_BLOCK[:block_size]
        ).astype(np.uint64)
        steps = np.cumsum(sums * _PER_DEPTH[depth : depth + count], dtype=np.uint64)
    return [(int(step) + parent_key) & _MASK for step in steps]


@dataclass(slots=True)
class SlotCounts:
    """What one engine's events did to the index (counters since the slot was first fed)."""

    batches: int = 0
    stored: int = 0  # blocks
    removed: int = 0  # blocks
    cleared: int = 0  # AllBlocksCleared, and clears after a gap nobody replayed
    gaps: int = 0  # stored blocks dropped: their parent was never seen
    ignored: int = 0  # stored blocks not kept (another medium, group, block size; keyed)
    evicted: int = 0  # blocks dropped over the cap


class CachedBlocks:
    """One pool's exact index of its engines' prefix caches, fed by their events."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.block_size: int | None = None  # the pool's, from the first stored block
        # Per slot: engine hash -> (depth << 64 | key), oldest first.
        self._slots: dict[int, dict[int, int]] = {}
        self._holders: dict[int, int] = {}  # key -> bitmask of the slots holding it
        self.counts: dict[int, SlotCounts] = {}

    def publishes(self, slot: int) -> bool:
        """Whether this engine's events have been seen since it was last forgotten."""
        return slot in self._slots

    def blocks(self, slot: int) -> int:
        return len(self._slots.get(slot, ()))

    def total_blocks(self) -> int:
        return sum(len(held) for held in self._slots.values())

    def apply(self, slot: int, batch: EventBatch) -> None:
        held = self._slots.get(slot)
        if held is None:
            held = self._slots[slot] = {}
        counts = self.counts.get(slot)
        if counts is None:
            counts = self.counts[slot] = SlotCounts()
        counts.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(slot, held, counts, event)
            elif isinstance(event, BlockRemoved):
                if event.medium in _GPU and (event.group_idx or 0) == 0:
                    for digest in event.block_hashes:
                        packed = held.pop(digest, None)
                        if packed is not None:
                            counts.removed += 1
                            self._drop(packed & _MASK, slot)
            elif isinstance(event, AllBlocksCleared):
                counts.cleared += 1
                self._clear(slot, held)
        over = len(held) - self.max_blocks
        if over > 0:
            counts.evicted += over
            for digest in list(held)[:over]:  # dicts keep insertion order: oldest first
                self._drop(held.pop(digest) & _MASK, slot)

    def _store(
        self, slot: int, held: dict[int, int], counts: SlotCounts, event: BlockStored
    ) -> None:
        size = self.block_size
        if size is None:
            size = self.block_size = event.block_size
        if (
            event.keyed
            or event.medium not in _GPU
            or (event.group_idx or 0) != 0
            or event.block_size != size
        ):
            counts.ignored += len(event.block_hashes)
            return
        if event.parent_block_hash is None:
            parent_key = depth = 0
        else:
            packed = held.get(event.parent_block_hash)
            if packed is None:
                counts.gaps += len(event.block_hashes)
                return
            parent_key, depth = packed & _MASK, packed >> 64
        tokens = np.asarray(event.token_ids, dtype=np.int64).astype(np.uint32)
        keys = _stored_keys(parent_key, depth, tokens, size)
        bit = 1 << slot
        holders = self._holders
        for index, (digest, key) in enumerate(zip(event.block_hashes, keys, strict=False)):
            if digest not in held:
                counts.stored += 1
            held[digest] = (depth + index + 1) << 64 | key
            holders[key] = holders.get(key, 0) | bit

    def _drop(self, key: int, slot: int) -> None:
        mask = self._holders.get(key, 0) & ~(1 << slot)
        if mask:
            self._holders[key] = mask
        else:
            self._holders.pop(key, None)

    def _clear(self, slot: int, held: dict[int, int]) -> None:
        for packed in held.values():
            self._drop(packed & _MASK, slot)
        held.clear()

    def clear(self, slot: int) -> None:
        """Everything this engine held is unknown now (a gap nobody replayed): it still
        publishes, from an empty index."""
        held = self._slots.get(slot)
        if held is not None:
            self._clear(slot, held)
            self.counts.setdefault(slot, SlotCounts()).cleared += 1

    def forget(self, slot: int) -> None:
        """The engine left or restarted: no index for it until it publishes again."""
        held = self._slots.pop(slot, None)
        if held is not None:
            self._clear(slot, held)

    def matched_tokens(self, keys: np.ndarray, slots: Sequence[int]) -> list[int]:
        """For each slot, the tokens of the prompt's longest prefix its cache holds (0 for
        a slot that does not publish). `keys`: `block_keys` of the templated prompt in the
        pool's `block_size`."""
        size = self.block_size or 0
        count = int(keys.shape[0])
        matched = [0] * len(slots)
        if not count or not size:
            return matched
        holders = self._holders
        # Binary search per slot for the deepest block it holds, where one holding block j
        # holds every block ahead of it (module docstring).
        for i, slot in enumerate(slots):
            if slot not in self._slots or not holders.get(int(keys[0]), 0) >> slot & 1:
                continue
            low, high = 1, count  # blocks [0, low) held; [high, count) not
            while low < high:
                middle = (low + high) // 2
                if holders.get(int(keys[middle]), 0) >> slot & 1:
                    low = middle + 1
                else:
                    high = middle
            matched[i] = low * size
        return matched
