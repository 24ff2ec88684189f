"""Byte-level mutation of the real message sequences of tooling.fuzz.seeds (bit flips,
truncation, splicing, insertions, duplicated ranges), and the ext_proc and access-log
streams mutated from them. What comes out is bytes, sent as they are: the sidecar's own
deserializer meets what does not parse.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tooling.fuzz.cases import LogCase, StreamCase
from tooling.fuzz.seeds import access_log_seeds, ext_proc_seeds

_EXT_PROC_SEEDS = [[m.SerializeToString() for m in seq] for seq in ext_proc_seeds()]
_LOG_SEEDS = [m.SerializeToString() for m in access_log_seeds()]
_ALL_SEED_BYTES = [m for seq in _EXT_PROC_SEEDS for m in seq] + _LOG_SEEDS
_mutation = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "truncate", "splice", "duplicate"]),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 16),
    st.binary(min_size=1, max_size=8),
)


def mutate(data: bytes, mutations: list[tuple[str, int, int, bytes]]) -> bytes:
    """`data` with each mutation applied in turn (positions wrap around its length)."""
    out = bytearray(data)
    for op, at, span, extra in mutations:
        size = len(out)
        where = at % (size + 1)
        length = 1 + span % 16
        if op == "flip" and size:
            out[where % size] ^= 1 << (span % 8)
        elif op == "set" and size:
            out[where % size] = extra[0]
        elif op == "delete":
            del out[where : where + length]
        elif op == "insert":
            out[where:where] = extra
        elif op == "truncate":
            del out[where:]
        elif op == "splice":
            donor = _ALL_SEED_BYTES[span % len(_ALL_SEED_BYTES)]
            start = at % (len(donor) + 1)
            out[where:where] = donor[start : start + 1 + extra[0]]
        elif op == "duplicate":
            out[where:where] = out[where : where + length]
    return bytes(out)


@st.composite
def mutated_streams(draw: st.DrawFn) -> StreamCase:
    index = draw(st.integers(0, len(_EXT_PROC_SEEDS) - 1))
    messages = list(_EXT_PROC_SEEDS[index])
    for position in draw(st.lists(st.integers(0, len(messages) - 1), min_size=1, max_size=3)):
        messages[position] = mutate(
            messages[position], draw(st.lists(_mutation, min_size=1, max_size=4))
        )
    shape = draw(st.sampled_from(["keep", "keep", "drop", "repeat", "swap"]))
    at = draw(st.integers(0, len(messages) - 1))
    if shape == "drop" and len(messages) > 1:
        del messages[at]
    elif shape == "repeat":
        messages.insert(at, messages[at])
    elif shape == "swap" and at + 1 < len(messages):
        messages[at], messages[at + 1] = messages[at + 1], messages[at]
    cancel = draw(st.none() | st.none() | st.integers(0, 3))
    return StreamCase(tuple(messages), cancel, f"seed {index} mutated")


@st.composite
def mutated_logs(draw: st.DrawFn) -> LogCase:
    indexes = draw(st.lists(st.integers(0, len(_LOG_SEEDS) - 1), min_size=1, max_size=3))
    messages = [mutate(_LOG_SEEDS[i], draw(st.lists(_mutation, max_size=4))) for i in indexes]
    return LogCase(tuple(messages), draw(st.integers(0, 3)), f"seeds {indexes} mutated")
