"""EnginePicker with engines that publish KV events: exact matches where they publish, the
approximate index where they do not, forgotten when an engine comes back."""

from __future__ import annotations

import dataclasses

import numpy as np

from engines.kv_events import AllBlocksCleared, BlockStored, EventBatch
from engines.picker import EnginePicker
from engines.prefix import prompt_blocks, text_blocks
from engines.state import EngineFleet
from policy.domain import KvEvents, Pool
from policy.loader import parse_policy
from policy.schema import EngineHealthConfig
from tests.support.clock import VirtualClock

A, B = ("10.0.0.1", 8000), ("10.0.0.2", 8000)
ADDRESS_A, ADDRESS_B = "10.0.0.1:8000", "10.0.0.2:8000"
PROMPT = np.arange(5000, 5000 + 16 * 40, dtype=np.uint32)


def setup() -> tuple[EnginePicker, EngineFleet, Pool]:
    clock = VirtualClock()
    policy = parse_policy({})
    spec = Pool("p", (A, B), kv_events=KvEvents(max_blocks=1000))
    policy = dataclasses.replace(policy, pools={**policy.pools, "p": spec})
    fleet = EngineFleet(EngineHealthConfig, clock)
    fleet.sync("p", [A, B])
    return EnginePicker(fleet, lambda: policy, clock), fleet, spec


def blocks(ids: np.ndarray = PROMPT):  # type: ignore[no-untyped-def]
    counted = prompt_blocks([text_blocks(ids, 64)], [len(ids)], 64)
    return dataclasses.replace(counted, engine_ids=ids)


def stored(count: int) -> EventBatch:
    tokens = tuple(int(t) for t in PROMPT[: count * 16])
    return EventBatch(0.0, (BlockStored(tuple(range(1, count + 1)), None, tokens, 16),))


def test_a_publishing_engine_is_scored_from_what_it_holds() -> None:
    picker, _, spec = setup()
    picker.kv_events("p", ADDRESS_B, stored(30))
    matched = {
        c.address: (c.matched_tokens, c.exact_prefix) for c in picker.candidates(spec, blocks())
    }
    assert matched == {ADDRESS_A: (0, False), ADDRESS_B: (480, True)}
    assert picker.pick("r1", spec, blocks(), "0-4k", 10, 1)[0] == ADDRESS_B
    # Without the engine's ids (not built for this request): the approximate index.
    plain = dataclasses.replace(blocks(), engine_ids=None)
    assert not any(c.exact_prefix for c in picker.candidates(spec, plain))


def test_cleared_and_returned_engines_hold_nothing() -> None:
    picker, fleet, spec = setup()
    picker.kv_events("p", ADDRESS_B, stored(30))
    picker.kv_events("p", ADDRESS_B, EventBatch(0.0, (AllBlocksCleared(),)))
    assert [c.matched_tokens for c in picker.candidates(spec, blocks())] == [0, 0]
    picker.kv_events("p", ADDRESS_B, stored(30))
    for _ in range(2):
        fleet.probed("p", ADDRESS_B, False)
    for _ in range(2):
        fleet.probed("p", ADDRESS_B, True)
    candidates = picker.candidates(spec, blocks())
    assert [c.matched_tokens for c in candidates] == [0, 0]
    assert not picker.cached["p"].publishes(1)


def test_a_cached_head_pulls_when_the_match_is_exact() -> None:
    """The approximate score leaves the conversation's head out; an exact one counts it."""
    picker, _, spec = setup()
    picker.kv_events("p", ADDRESS_A, stored(40))
    head_only = dataclasses.replace(blocks(), head_tokens=len(PROMPT))
    (first, _) = picker.candidates(spec, head_only)
    assert first.exact_prefix and first.matched_tokens == len(PROMPT)
    assert picker.pick("r", spec, head_only, "0-4k", 10, 1)[0] == ADDRESS_A
