"""What an engine says its prefix cache holds: vLLM's KV cache events, as slogate keeps them,
and their msgpack wire form. Pure.

What lives here: `BlockStored`, `BlockRemoved`, `AllBlocksCleared` (`KvEvent`), `EventBatch`,
`decode_batch` (one ZMQ payload -> an `EventBatch`) and `encode_batch` (what the simulated
engines publish).

The wire (vLLM's `vllm.distributed.kv_events`, `--kv-events-config`): each ZMQ message is
(topic, 8-byte big-endian sequence number, payload); the payload is a msgpack `EventBatch`,
always an array `[ts, events, data_parallel_rank?]`. The events inside changed form:
- arrays in older releases: `["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, ...]` (a msgspec tagged `array_like` struct: tag first,
  trailing defaults left out);
- named maps since a 2026 release (0.26 and on; 0.32 here): `{"type": "BlockStored",
  "block_hashes": [...], ...}`, with fields added release after release (`lora_name`,
  `extra_keys`, `group_idx`, `kv_cache_spec_kind`, `locality`, ...).
Both decode here; fields this module does not know are ignored, so a newer engine's events
still decode. An event of an unknown type is skipped.

Block hashes are 64-bit ints when the engine converts them (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`,
on by default) and the raw digest bytes otherwise; bytes become ints here the way the engine
converts them (`int.from_bytes(digest, "big") & (2**64 - 1)`), so both name a block alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

_MASK = (1 << 64) - 1
# The array form's field order after the tag (vllm.distributed.kv_events, oldest fields first).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks the engine's prefix cache now holds, each chained to the one before;
    `parent_block_hash` is the block ahead of the first (None: they start the prompt).
    `keyed`: the hashes also cover something beside the tokens (a LoRA adapter, multimodal
    inputs, a cache salt), so the same tokens hash otherwise on a plain request."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    group_idx: int | None = None
    keyed: bool = False


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None


class BadBatch(ValueError):
    """A payload that is not a KV event batch."""


def block_hash(value: object) -> int:
    """A block hash as the engine publishes it converted to ints: bytes -> their last 64
    bits read big-endian (vLLM's `maybe_convert_block_hash`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK
    if isinstance(value, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(value), "big") & _MASK
    raise BadBatch(f"a block hash that is neither an int nor bytes: {type(value).__name__}")


def _hashes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise BadBatch("block_hashes is not a list")
    return tuple(block_hash(item) for item in value)


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _fields(raw: dict[str, Any] | list[Any]) -> tuple[object, dict[str, Any]]:
    """(type, fields by name) of one event in either form."""
    if isinstance(raw, dict):
        return raw.get("type"), raw
    if not raw:
        return None, {}
    kind = raw[0]
    names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
    return kind, dict(zip(names, raw[1:], strict=False))


def _event(raw: dict[str, Any] | list[Any]) -> KvEvent | None:
    kind, fields = _fields(raw)
    if kind == "BlockStored":
        tokens = fields.get("token_ids")
        size = fields.get("block_size")
        if not isinstance(tokens, list | tuple) or not isinstance(size, int) or size <= 0:
            raise BadBatch("BlockStored without token_ids or block_size")
        parent = fields.get("parent_block_hash")
        extra = fields.get("extra_keys")
        lora_id = _optional_int(fields.get("lora_id"))
        keyed = (
            lora_id is not None
            or fields.get("lora_name") is not None
            or (isinstance(extra, list | tuple) and any(item is not None for item in extra))
        )
        return BlockStored(
            _hashes(fields.get("block_hashes")),
            None if parent is None else block_hash(parent),
            tuple(int(token) for token in tokens),
            size,
            lora_id,
            _optional_str(fields.get("medium")),
            _optional_int(fields.get("group_idx")),
            keyed,
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            _hashes(fields.get("block_hashes")),
            _optional_str(fields.get("medium")),
            _optional_int(fields.get("group_idx")),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """One published payload, in either encoding. Raises `BadBatch` when it is none."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as error:
        raise BadBatch(f"not msgpack: {error}") from None
    if isinstance(raw, dict):  # not sent by any release seen, but cheap to accept
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise BadBatch("not an event batch")
    if not isinstance(ts, int | float) or not isinstance(events, list | tuple):
        raise BadBatch("not an event batch")
    decoded = []
    for item in events:
        if not isinstance(item, dict | list):
            raise BadBatch("an event that is neither a map nor an array")
        event = _event(item)
        if event is not None:
            decoded.append(event)
    return EventBatch(float(ts), tuple(decoded), _optional_int(rank))


def _wire(event: KvEvent, named: bool) -> dict[str, Any] | list[Any]:
    if isinstance(event, BlockStored):
        values: list[Any] = [
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            event.medium,
        ]
        names = _STORED_FIELDS[: len(values)]
        kind = "BlockStored"
    elif isinstance(event, BlockRemoved):
        values = [list(event.block_hashes), event.medium]
        names = _REMOVED_FIELDS[: len(values)]
        kind = "BlockRemoved"
    else:
        values, names, kind = [], (), "AllBlocksCleared"
    if named:
        return {"type": kind, **dict(zip(names, values, strict=True))}
    return [kind, *values]


def encode_batch(batch: EventBatch, *, named: bool = True) -> bytes:
    """A batch as an engine publishes it: named-map events (`named`, as vLLM 0.26+) or the
    older array events."""
    events = [_wire(event, named) for event in batch.events]
    return msgspec.msgpack.encode([batch.ts, events, batch.data_parallel_rank])
