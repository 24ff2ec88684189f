"""The engine's own block hashes (vLLM's prefix caching), computed here. Pure.

What lives here: `HASH_ALGORITHMS` and `engine_block_hashes`, which hashes a templated
prompt's full blocks exactly as vLLM 0.32's `hash_block_tokens` does, and returns them as
the engine publishes them in its KV events (64-bit ints).

vLLM's rule (v1/core/kv_cache_utils.py, utils/hashing.py): block j's hash is
`hash_fn((parent, tuple(block_j_token_ids), extra_keys))`, its parent the previous block's
full digest, the first block's parent `NONE_HASH = hash_fn(seed)`. `hash_fn` is the
`--prefix-caching-hash-algo`: sha256 (pickle, the default), sha256_cbor (canonical CBOR),
xxhash / xxhash_cbor (xxh3-128). The seed is PYTHONHASHSEED where the engine's
environment sets it; otherwise "vllm-none-hash" for the sha256 ones (since vLLM 0.2x;
older releases drew it at random) and random bytes per process for xxhash — whose hashes
nobody outside the engine can then compute. Published hashes are the digest's last 8
bytes read big-endian (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, the default).

This is not what the request path scores with (engines.cached_blocks keys blocks in a
space of its own, one pass over the prompt and no configuration); it is what checks that
slogate's templated ids are the engine's (`slogate` against a real vLLM: the hashes agree
block for block exactly when the ids do) and what an operator who sets the seed can use.
Cost: one hash call per block (~3 us for sha256 of 16 tokens; ~2,000 calls for 32k tokens).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_SEED = "vllm-none-hash"  # vLLM's DEFAULT_NONE_HASH_SEED (cryptographic algorithms)
_MASK = (1 << 64) - 1


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    import cbor2  # vLLM's own dependency; only sha256_cbor / xxhash_cbor need it

    return bytes(cbor2.dumps(value, canonical=True))


def _xxh3(data: bytes) -> bytes:
    import xxhash  # optional, as in vLLM

    return bytes(xxhash.xxh3_128_digest(data))


def hash_function(algorithm: str) -> Callable[[Any], bytes]:
    """vLLM's `get_hash_fn_by_name`."""
    if algorithm == "sha256":
        return lambda value: hashlib.sha256(_pickled(value)).digest()
    if algorithm == "sha256_cbor":
        return lambda value: hashlib.sha256(_cbor(value)).digest()
    if algorithm == "xxhash":
        return lambda value: _xxh3(_pickled(value))
    if algorithm == "xxhash_cbor":
        return lambda value: _xxh3(_cbor(value))
    raise ValueError(f"no prefix caching hash algorithm named {algorithm!r}")


def engine_block_hashes(
    ids: Sequence[int], block_size: int, algorithm: str = "sha256", seed: str | None = None
) -> list[int]:
    """The published hashes of `ids`' full blocks (a plain prompt: no LoRA, multimodal
    inputs or cache salt). `seed`: the engine's PYTHONHASHSEED, None where it has none
    (then xxhash's seed is the engine's secret: ValueError)."""
    if seed is None:
        if algorithm.startswith("xxhash"):
            raise ValueError(
                f"{algorithm} without PYTHONHASHSEED: the engine's seed is random per process"
            )
        seed = DEFAULT_SEED
    hash_fn = hash_function(algorithm)
    parent = hash_fn(seed)
    hashes = []
    for start in range(0, len(ids) - block_size + 1, block_size):
        block = tuple(int(token) for token in ids[start : start + block_size])
        parent = hash_fn((parent, block, None))
        hashes.append(int.from_bytes(parent, "big") & _MASK)
    return hashes
