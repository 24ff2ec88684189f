"""engines.kv_events against vLLM's own structs: both encodings, bytes hashes, later fields."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from engines.kv_events import (
    AllBlocksCleared,
    BadBatch,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    encode_batch,
)


# vLLM's structs before the 2026 change (examples/online_serving/kv_events_subscriber.py of
# that time): events are tagged arrays.
class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class _ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class _ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


def test_decodes_the_array_encoding() -> None:
    payload = msgspec.msgpack.encode(
        _ArrayBatch(
            1.5,
            [
                _ArrayStored([7, 8], None, list(range(32)), 16, None, "GPU"),
                _ArrayRemoved([7], "GPU"),
                _ArrayCleared(),
            ],
        )
    )
    batch = decode_batch(payload)
    assert batch == EventBatch(
        1.5,
        (
            BlockStored((7, 8), None, tuple(range(32)), 16, None, "GPU"),
            BlockRemoved((7,), "GPU"),
            AllBlocksCleared(),
        ),
    )


def test_decodes_the_named_encoding_with_fields_added_later() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [2**64 - 1],
        "parent_block_hash": 3,
        "token_ids": [1] * 16,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "a_field_from_the_future": {"x": 1},
    }
    batch = decode_batch(msgspec.msgpack.encode([2.0, [event, {"type": "Unknown"}], 0]))
    assert batch.events == (BlockStored((2**64 - 1,), 3, (1,) * 16, 16, None, "GPU", 0),)
    assert batch.data_parallel_rank == 0


def test_bytes_hashes_become_the_engines_int_conversion() -> None:
    digest = bytes(range(32))
    payload = msgspec.msgpack.encode(
        [0.0, [{"type": "BlockRemoved", "block_hashes": [digest], "medium": None}]]
    )
    (event,) = decode_batch(payload).events
    assert isinstance(event, BlockRemoved)
    assert event.block_hashes == (int.from_bytes(digest, "big") & (2**64 - 1),)


def test_keyed_blocks_are_marked() -> None:
    named = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}
    named |= {"token_ids": [1] * 16, "block_size": 16, "lora_name": "adapter"}
    (event,) = decode_batch(msgspec.msgpack.encode([0.0, [named]])).events
    assert isinstance(event, BlockStored) and event.keyed


@pytest.mark.parametrize("named", [True, False])
def test_encode_round_trips(named: bool) -> None:
    batch = EventBatch(
        3.0,
        (
            BlockStored((5, 6), 4, (1,) * 32, 16, medium="GPU"),
            BlockRemoved((7,)),
            AllBlocksCleared(),
        ),
    )
    assert decode_batch(encode_batch(batch, named=named)) == batch


# vLLM 0.32's structs (vllm/distributed/kv_events.py): the batch an array, events named maps.
# Copied, not imported: importing vLLM costs ~14 s and torch.
class _NamedBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _NamedEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _NamedStored(_NamedEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


def test_decodes_vllm_0_32s_named_structs() -> None:
    stored = _NamedStored([1, 2], None, list(range(32)), 16, None, "GPU", None, [None, None], 0)
    decoded = decode_batch(msgspec.msgpack.encode(_NamedBatch(1.0, [stored], 0)))
    assert decoded.events == (BlockStored((1, 2), None, tuple(range(32)), 16, None, "GPU", 0),)


@pytest.mark.parametrize(
    "payload", [b"\xc1", msgspec.msgpack.encode({"a": 1}), msgspec.msgpack.encode([1.0, [3]])]
)
def test_not_a_batch_is_refused(payload: bytes) -> None:
    with pytest.raises(BadBatch):
        decode_batch(payload)
