"""The prefix-state study on a tiny version of llm-d's shape: the engines' KV events reach
the picker, and picking from them finds at least the prefix hits the approximate index does,
on the same arrivals."""

from __future__ import annotations

from typing import Any

import pytest

from sim.fleet.fleet_types import EngineOutage
from sim.fleet.offline import OfflineFleet
from sim.server.paged_kv import PagedKvCache
from sim.studies.prefix_state import (
    ARMS,
    PrefixShape,
    compare_prefix_state,
    delivered_events,
    prefix_arrivals,
    prefix_policy,
)

TINY = PrefixShape(
    engines=2,
    kv_tokens=16_000,
    prefix_tokens=1_000,
    question_tokens=200,
    output_tokens=60,
    max_tokens=120,
    rates=(3.0, 6.0),
    step_s=20.0,
)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return compare_prefix_state(TINY)


def _overall_hit_rate(report: dict[str, Any], arm: str) -> float:
    rows = [r for r in report["rows"] if r["arm"] == arm]
    return sum(r["prefix_hit_rate"] * r["served"] for r in rows) / sum(r["served"] for r in rows)


def test_every_arm_plays_the_same_arrivals_at_every_step(report: dict[str, Any]) -> None:
    assert TINY.customers == 23  # 73% of the fleet's 32k KV in 1,000-token prefixes
    per_arm = {arm: [r["requests"] for r in report["rows"] if r["arm"] == arm] for arm in ARMS}
    assert per_arm["round-robin"] == per_arm["approximate"] == per_arm["precise"]
    assert sum(per_arm["precise"]) == report["requests"] > 0


def test_the_engines_events_reach_the_pickers_index_only_when_they_publish(
    report: dict[str, Any],
) -> None:
    precise = report["events"]["precise"]
    assert precise["batches"] > 0 and precise["stored"] > 0
    assert precise["gaps"] == 0  # every stored block's parent was seen before it
    assert report["events"]["approximate"]["batches"] == 0


def test_picking_from_the_events_hits_at_least_what_the_approximate_index_does(
    report: dict[str, Any],
) -> None:
    precise = _overall_hit_rate(report, "precise")
    assert precise >= _overall_hit_rate(report, "approximate")
    # A customer's prefix is most of each prompt: kept together, most of it hits.
    assert precise > 0.5


def test_a_restarted_engine_says_its_cache_is_empty_and_the_picker_forgets_it() -> None:
    policy = prefix_policy(TINY, "precise")
    key = policy.key_for("sk-customers")
    assert key is not None
    fleet = OfflineFleet(
        policy,
        budgets=False,
        breaker=False,
        engines={"default": TINY.engines},
        kv_capacity_tokens=TINY.kv_tokens * TINY.engines,
        block_size=TINY.block_size,
        kv_events_delay_s=TINY.events_delay_s,
        outages=[EngineOutage("default", 0, at_s=15.0, until_s=25.0)],
    )
    fleet.run(prefix_arrivals(TINY, key), TINY.duration_s + 30.0)
    assert delivered_events(fleet)["cleared"] == 1  # the engine's first batch after it started
    picker = fleet.sidecars[0].picker
    engine = fleet.engines["default"].engines[0]
    assert isinstance(engine.kv, PagedKvCache)
    assert engine.kv.cached_blocks > 0  # it cached again since
    # What the picker's index holds of it is what it stored since it came back.
    assert picker.cached["default"].blocks(0) <= engine.kv.cached_blocks
