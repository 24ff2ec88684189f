"""The simulator's engines behind the sidecar's own picker (sim.fleet.engine_pool,
sim.studies.engine_compare): chats keep their history's cache with slogate's picking and lose it
with round robin; a killed engine loses what ran on it, and the rest is served."""

from __future__ import annotations

from sim.fleet.engine_pool import EnginePool
from sim.studies.engine_compare import run_picking


def test_picking_keeps_chats_where_their_history_is_cached() -> None:
    spread = run_picking("chat-long", 50.0, "envoy", 20.0, seed=3)
    picked = run_picking("chat-long", 50.0, "slogate", 20.0, seed=3)
    assert spread["engines"] == picked["engines"] == 2
    assert spread["requests"] == picked["requests"] > 250
    assert picked["prefix_hit_rate"] > spread["prefix_hit_rate"] + 0.1


def test_a_killed_engine_loses_only_what_ran_on_it() -> None:
    report = run_picking("chat", 50.0, "slogate", 20.0, seed=3, outage_at_s=10.0)
    assert report["lost_with_the_engine"] > 0
    assert report["served_after_outage"]["critical"] == 1.0
    assert report["max_level"] <= 1


def test_envoy_retries_a_refused_engine_on_the_second_named_one() -> None:
    pool = EnginePool(["10.0.0.1:8000", "10.0.0.2:8000"], 1000, 10, 10, 1.0, 10)
    first, second = pool.engines
    first.up, first.down_since_s = False, 100.0
    assert pool.reach(["10.0.0.1:8000", "10.0.0.2:8000"], 100.5, 2.0) == (second, True)
    assert pool.reach(["10.0.0.1:8000"], 100.5, 2.0) == (second, True)  # round robin's
    # Unnamed, before the health checks see it down: round robin may still pick it.
    reached = [pool.reach([], 100.5, 2.0)[0] for _ in range(4)]
    assert reached == [second] * 4  # the dead one refused, retried on the other
    second.up = False
    assert pool.reach(["10.0.0.2:8000", "10.0.0.1:8000"], 103.0, 2.0) == (None, True)
