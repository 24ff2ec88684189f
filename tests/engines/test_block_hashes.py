"""engines.block_hashes against hashes vLLM 0.32 computed (kv_cache_utils.hash_block_tokens
and maybe_convert_block_hash over ids 100..147, blocks of 16; taken once, pinned here: vLLM
is not imported in slogate's tests)."""

from __future__ import annotations

import pytest

from engines.block_hashes import engine_block_hashes

IDS = list(range(100, 148))
VLLM = {
    (None, "sha256"): [15126711022707342677, 3356471519746799895, 1463280755642362985],
    (None, "sha256_cbor"): [10428775992902877628, 8101442038445348984, 9222808348315984622],
    ("7", "sha256"): [13198273456535363386, 12641977865059380467, 12552409789643016519],
    ("7", "sha256_cbor"): [14371954562395144677, 3296111855106761464, 5524048204098730437],
}


@pytest.mark.parametrize(("seed", "algorithm"), list(VLLM))
def test_the_engines_hashes(seed: str | None, algorithm: str) -> None:
    assert engine_block_hashes(IDS, 16, algorithm, seed) == VLLM[(seed, algorithm)]
    # A partial last block is not hashed.
    assert engine_block_hashes([*IDS, 1, 2], 16, algorithm, seed) == VLLM[(seed, algorithm)]


def test_xxhash_without_a_seed_cannot_be_computed() -> None:
    with pytest.raises(ValueError, match="random per process"):
        engine_block_hashes(IDS, 16, "xxhash")
