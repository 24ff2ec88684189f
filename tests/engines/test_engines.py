"""The engines inside a pool, pure: their state, the capacity they add up to, prefix hashes
and the index, the scorers and the picker (engines/)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from breaker.board import error_rate
from breaker.engine import EngineSnapshot
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel, BreakerState, Signals, step
from engines.engine import EngineState, engine_address
from engines.picker import EnginePicker
from engines.prefix import NO_BLOCKS, PrefixIndex, ladder, prompt_blocks, text_blocks
from engines.scoring import EngineCandidate, pick, rendezvous, score
from engines.state import EngineFleet
from policy.domain import Picker, Pool
from policy.loader import parse_policy
from policy.schema import EngineHealthConfig, PickingConfig
from tests.support.clock import VirtualClock as FakeClock

HEALTH = EngineHealthConfig()
A, B, C = ("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.3", 8000)


def fleet_of(clock: FakeClock, *engines: tuple[str, int], pool: str = "p") -> EngineFleet:
    fleet = EngineFleet(lambda: HEALTH, clock)
    fleet.sync(pool, engines)
    return fleet


def test_failed_probes_kill_an_engine_and_answered_ones_bring_it_back() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    assert fleet.probed("p", "10.0.0.1:8000", False) is EngineState.SERVING  # one is not enough
    assert fleet.probed("p", "10.0.0.1:8000", False) is EngineState.DEAD
    assert [e.address for e in fleet.serving("p")] == ["10.0.0.2:8000"]
    assert fleet.probed("p", "10.0.0.1:8000", True) is EngineState.DEAD
    assert fleet.probed("p", "10.0.0.1:8000", True) is EngineState.SERVING
    assert fleet.engines("p")[0].returns == 1  # its prefix cache is gone


def test_failed_answers_eject_an_engine_for_longer_each_time() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    address = "10.0.0.1:8000"
    assert not fleet.answered("p", address, failed=True)
    assert not fleet.answered("p", address, failed=False)  # a success resets the count
    ejected = [fleet.answered("p", address, failed=True) for _ in range(3)]
    assert ejected == [False, False, True]
    engine = fleet.get("p", address)
    assert engine is not None and fleet.state(engine) is EngineState.DEAD
    clock.now_s += HEALTH.eject_s + 0.1
    assert fleet.state(engine) is EngineState.SERVING
    for _ in range(3):
        fleet.answered("p", address, failed=True)
    assert engine.ejected_until_s == pytest.approx(clock() + 2 * HEALTH.eject_s)


def test_an_engine_back_from_the_dead_is_judged_on_its_answers_from_then_on() -> None:
    """Killed and started again on its port: the requests that met it dead failed (some
    logged after it was back), and none of that may eject the new process (issue 37: the
    restarted engine was ejected 3 s after its return and later tests got a pool of one)."""
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    address = "10.0.0.1:8000"
    engine = fleet.get("p", address)
    assert engine is not None
    assert not any(fleet.answered("p", address, failed=True) for _ in range(2))
    for _ in range(HEALTH.unhealthy_after):
        fleet.probed("p", address, False)
    assert not any(fleet.answered("p", address, failed=True) for _ in range(10))  # while dead
    for _ in range(HEALTH.healthy_after):
        fleet.probed("p", address, True)
    assert fleet.state(engine) is EngineState.SERVING
    late = [fleet.answered("p", address, failed=True) for _ in range(HEALTH.eject_after_errors)]
    assert late[:-1] == [False] * (HEALTH.eject_after_errors - 1)  # counted from its return
    assert engine.failed == 2 + 10 + HEALTH.eject_after_errors  # all still in its totals


def test_an_engine_back_in_its_pool_stays_out_of_its_signals_for_a_window() -> None:
    """The failures that ejected it (or met it dead) are still in the breaker's window when
    it is back: counted then, they tripped the pool's error breaker after the engine was
    fine again (issue 37, test_e2e_engines under load)."""
    clock = FakeClock()
    fleet = EngineFleet(lambda: HEALTH, clock, window_s=lambda: 20.0)
    fleet.sync("p", [A, B])
    ejected = "10.0.0.1:8000"
    assert [fleet.answered("p", ejected, True) for _ in range(3)][-1]
    clock.now_s += HEALTH.eject_s + 0.1
    assert [e.address for e in fleet.serving("p")] == [ejected, "10.0.0.2:8000"]  # picked again
    assert fleet.out("p") == {ejected}  # but its failures are still in the window
    clock.now_s += 20.0
    assert fleet.out("p") == frozenset()
    for _ in range(HEALTH.unhealthy_after):
        fleet.probed("p", "10.0.0.2:8000", False)
    for _ in range(HEALTH.healthy_after):
        fleet.probed("p", "10.0.0.2:8000", True)
    assert fleet.out("p") == {"10.0.0.2:8000"}
    assert [fleet.answered("p", ejected, True) for _ in range(3)][-1]
    assert fleet.out("p") == {ejected}  # both out lately: the one out now, some still count
    clock.now_s += HEALTH.eject_s * 2 + 20.1
    assert fleet.out("p") == frozenset()


def test_a_draining_engine_takes_nothing_new_but_its_requests_keep_their_room() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    spec = Pool("p", (A, B), kv_capacity_tokens=1000, max_num_seqs=10)
    fleet.hold("r1", "p", "10.0.0.1:8000", 300, 2)
    assert fleet.drain("10.0.0.1:8000", True)
    assert [e.address for e in fleet.serving("p")] == ["10.0.0.2:8000"]
    live = fleet.live_pool(spec)
    assert (live.kv_capacity_tokens, live.max_num_seqs) == (500 + 300, 5 + 2)
    fleet.release("r1")
    live = fleet.live_pool(spec)
    assert (live.kv_capacity_tokens, live.max_num_seqs) == (500, 5)
    fleet.drain("10.0.0.1:8000", False)
    assert fleet.live_pool(spec).kv_capacity_tokens == 1000


def test_an_engine_that_reports_its_cache_counts_with_it() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    spec = Pool("p", (A, B), kv_capacity_tokens=1000)
    fleet.observe("p", "10.0.0.2:8000", EngineSnapshot(0.5, 1, 0, None, (), 4000.0))
    assert fleet.live_pool(spec).kv_capacity_tokens == 500 + 4000
    # The pool's usage weighs each engine by its cache; one never scraped is no data.
    assert fleet.kv_usage("p") == pytest.approx(0.5)
    fleet.observe("p", "10.0.0.1:8000", EngineSnapshot(1.0, 1, 0, None, (), 1000.0))
    assert fleet.kv_usage("p") == pytest.approx((1000 * 1.0 + 4000 * 0.5) / 5000)
    clock.now_s += 30.0  # both stale: a serving engine without fresh metrics reads full
    assert fleet.kv_usage("p") == 1.0


def test_a_dead_engine_leaves_the_pools_signals_until_none_serves() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    assert fleet.out("p") == frozenset() and fleet.up_fraction("p") == 1.0
    for _ in range(2):
        fleet.probed("p", "10.0.0.1:8000", False)
    assert fleet.out("p") == {"10.0.0.1:8000"} and fleet.up_fraction("p") == 0.5
    for _ in range(2):
        fleet.probed("p", "10.0.0.2:8000", False)
    assert fleet.out("p") == frozenset()  # the whole pool fails: its breaker must see it
    assert fleet.up_fraction("p") == 0.0
    state = BreakerState("p")
    step(state, Signals(engines_up=0.0), 0.0)
    assert step(state, Signals(engines_up=0.0), 11.0) is not None
    assert state.level is BreakerLevel.L3


def test_the_error_rate_leaves_out_a_dead_engines_answers() -> None:
    clock = FakeClock()
    windows = ResponseWindows(clock, slot_s=5.0, horizon_s=60.0)
    policy = parse_policy({"breaker": {"min_samples": 10}})
    for _ in range(20):
        windows.record_response("default", 200, "10.0.0.2:8000")
    for _ in range(20):
        windows.record_response("default", 503, "10.0.0.1:8000")
    assert error_rate(windows, policy, "default") == pytest.approx(0.5)
    assert error_rate(windows, policy, "default", frozenset({"10.0.0.1:8000"})) == 0.0


def test_discovery_changes_are_named_and_known_engines_keep_their_state() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    fleet.drain("10.0.0.1:8000", True)
    assert fleet.sync("p", [A, C]) == ["-10.0.0.2:8000", "+10.0.0.3:8000"]
    engine = fleet.get("p", "10.0.0.1:8000")
    assert engine is not None and engine.draining
    assert fleet.get("p", "10.0.0.3:8000").slot == 2  # type: ignore[union-attr]


def blocks_of(*texts: np.ndarray, block_tokens: int = 4, head: int = 1):  # type: ignore[no-untyped-def]
    return prompt_blocks(
        [text_blocks(t, block_tokens) for t in texts],
        [len(t) for t in texts],
        block_tokens,
        head,
    )


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def test_block_hashes_agree_exactly_as_far_as_the_prefixes_do() -> None:
    rng = np.random.default_rng(3)
    system = rng.integers(0, 50_000, 200).astype(np.uint32)
    first = rng.integers(0, 50_000, 40).astype(np.uint32)
    second = rng.integers(0, 50_000, 40).astype(np.uint32)
    one = blocks_of(system, first, head=2)
    two = blocks_of(system, second, head=2)
    shared = sum(1 for a, b in zip(one.hashes, two.hashes, strict=False) if a == b)
    assert 0 < shared < len(one.hashes)
    assert one.hashes[:shared] == two.hashes[:shared]
    assert one.key != two.key  # the conversation key runs through the first user text
    assert blocks_of(system, first, head=1).key == blocks_of(system, second, head=1).key
    # One token changed at the very start: nothing agrees.
    changed = system.copy()
    changed[0] += 1
    assert not set(blocks_of(changed, first).hashes) & set(one.hashes)
    # The next turn of the chat resends the history: its key and prefix are the turn's.
    turn = blocks_of(system, first, ids(7, 7, 7), second, head=2)
    assert turn.key == one.key
    assert turn.hashes[: len(one.hashes) - 1] == one.hashes[:-1]


def test_the_ladder_keeps_few_positions_and_always_the_last() -> None:
    assert ladder(1) == (0,)
    positions = ladder(512)
    assert positions[:8] == tuple(range(8)) and positions[-1] == 511
    assert len(positions) <= 30
    assert all(b > a for a, b in itertools.pairwise(positions))


def test_the_prefix_index_is_bounded_and_measures_shared_prefixes() -> None:
    rng = np.random.default_rng(5)
    system = rng.integers(0, 50_000, 640).astype(np.uint32)
    one = blocks_of(system, rng.integers(0, 50_000, 64).astype(np.uint32), block_tokens=16)
    two = blocks_of(system, rng.integers(0, 50_000, 64).astype(np.uint32), block_tokens=16)
    index = PrefixIndex(entries=1_000)
    index.add(one, slot=1)
    matched = index.matched_tokens(two, [0, 1])
    assert matched[0] == 0
    # Within the ladder's precision (a quarter) of the 640 shared tokens, never beyond them.
    assert 640 * 0.75 <= matched[1] <= 640
    index.forget(1)
    assert index.matched_tokens(two, [1]) == [0] and len(index) == 0
    small = PrefixIndex(entries=10)
    for seed in range(20):
        text = np.random.default_rng(seed).integers(0, 50_000, 640).astype(np.uint32)
        small.add(blocks_of(text, block_tokens=16), slot=0)
    assert len(small) == 10


def candidate(address: str, slot: int, **fields: object) -> EngineCandidate:
    base = EngineCandidate(address, slot, 0, 0, 1000.0, 10.0)
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


CONFIG = PickingConfig()


def test_load_pulls_towards_the_freer_engine() -> None:
    blocks = blocks_of(ids(*range(40)))
    busy = candidate("a:1", 0, held_tokens=800, held_sequences=2)
    free = candidate("b:1", 1, held_tokens=100, held_sequences=2)
    only_load = dataclasses.replace(CONFIG, prefix_weight=0, affinity_weight=0, length_weight=0)
    assert pick([busy, free], blocks, "0-4k", only_load)[0] == "b:1"
    # The scraped usage (every replica's requests) corrects what this sidecar holds.
    scraped = dataclasses.replace(free, scraped_kv_usage=0.95)
    assert pick([busy, scraped], blocks, "0-4k", only_load)[0] == "a:1"


def test_a_cached_history_outweighs_a_little_load_but_a_cached_head_does_not() -> None:
    # A chat's head (40 tokens), then 360 tokens of history and the new question.
    blocks = blocks_of(ids(*range(40)), ids(*range(40, 400)))
    cached = candidate("a:1", 0, held_tokens=300, held_sequences=1, matched_tokens=380)
    empty = candidate("b:1", 1, held_tokens=100, held_sequences=1)
    chosen = pick([cached, empty], blocks, "0-4k", dataclasses.replace(CONFIG, affinity_weight=0))
    assert chosen == ["a:1", "b:1"]
    scores = {s.address: s for s in score([cached, empty], blocks, "0-4k", CONFIG)}
    assert scores["a:1"].prefix == pytest.approx(340 / 400) and scores["b:1"].prefix == 0.0
    # Only the head matched (a shared system prompt): no pull, every engine will hold it.
    head_only = dataclasses.replace(cached, matched_tokens=40)
    assert score([head_only, empty], blocks, "0-4k", CONFIG)[0].prefix == 0.0


def test_replicas_agree_on_a_conversations_engine_until_it_is_over_its_bound() -> None:
    engines = [candidate(f"10.0.0.{i}:8000", i) for i in range(4)]
    keys = [blocks_of(ids(i, i + 1, i + 2)) for i in range(40)]
    picked = [pick(engines, b, "0-4k", CONFIG)[0] for b in keys]
    assert picked == [pick(list(reversed(engines)), b, "0-4k", CONFIG)[0] for b in keys]
    assert len(set(picked)) > 1  # conversations spread
    first = keys[0]
    home = max(engines, key=lambda e: rendezvous(first.key, e.address)).address
    assert picked[0] == home
    # Its home holds more than 1.25x its fair share of the requests: it spills elsewhere.
    loaded = [dataclasses.replace(e, held_sequences=6 if e.address == home else 1) for e in engines]
    assert pick(loaded, first, "0-4k", CONFIG)[0] != home


def test_one_bucket_prefers_the_same_engines() -> None:
    engines = [candidate(f"10.0.0.{i}:8000", i) for i in range(4)]
    only_length = dataclasses.replace(CONFIG, prefix_weight=0, affinity_weight=0, load_weight=0)
    long_ones = {pick(engines, blocks_of(ids(i)), "8-32k", only_length)[0] for i in range(20)}
    assert len(long_ones) == 1


def test_the_picker_holds_the_footprint_on_its_engine_and_learns_the_prefix() -> None:
    clock = FakeClock()
    policy = parse_policy({})
    fleet = fleet_of(clock, A, B, pool="default")
    picker = EnginePicker(fleet, lambda: policy, clock)
    spec = Pool("default", (A, B), kv_capacity_tokens=1000, max_num_seqs=8)
    assert picker.wants_blocks(policy)  # a pool that picks among two engines
    envoy = dataclasses.replace(
        policy,
        pools={n: dataclasses.replace(p, picker=Picker.ENVOY) for n, p in policy.pools.items()},
    )
    assert not picker.wants_blocks(envoy)  # Envoy balances: no prompt is hashed
    blocks = blocks_of(np.arange(300, dtype=np.uint32), block_tokens=64)
    chosen = picker.pick("r1", spec, blocks, "0-4k", tokens=120, sequences=1)
    assert len(chosen) == 2
    engine = fleet.get("default", chosen[0])
    assert engine is not None and (engine.held_tokens, engine.held_sequences) == (120, 1)
    # While it runs, the same prompt again (a retry, a regenerate: all of it the
    # conversation's head, already sent there) goes to its engine, whose cache holds it...
    again_now = picker.pick("r2", spec, blocks, "0-4k", tokens=120, sequences=1)
    assert again_now[0] == chosen[0]
    # ... and a new conversation, whose head was never sent anywhere, to the other: it
    # would hold 3 of the 3 requests in flight on one engine (over 1.25x the mean).
    other = blocks_of(np.arange(1000, 1300, dtype=np.uint32), block_tokens=64)
    beside = picker.pick("r2b", spec, other, "0-4k", tokens=120, sequences=1)
    assert beside[0] == chosen[1]
    for request in ("r1", "r2", "r2b"):
        picker.release(request)
    assert engine.held_tokens == 0 and fleet.holds == 0
    again = picker.pick("r3", spec, blocks, "0-4k", tokens=120, sequences=1)
    assert again[0] == chosen[0]  # the conversation's engine, where its prefix is cached
    picker.release("r3")
    # Dead engines are never named; an external picker's pool gets no name at all.
    for _ in range(2):
        fleet.probed("default", chosen[0], False)
    assert picker.pick("r4", spec, blocks, "0-4k", 10, 1) == (chosen[1],)
    external = dataclasses.replace(spec, picker=Picker.EXTERNAL)
    assert picker.pick("r5", external, blocks, "0-4k", 10, 1) == ()


def test_answers_never_eject_more_than_half_the_pool() -> None:
    clock = FakeClock()
    fleet = fleet_of(clock, A, B)
    assert [fleet.answered("p", "10.0.0.1:8000", True) for _ in range(3)][-1]
    assert not any(fleet.answered("p", "10.0.0.2:8000", True) for _ in range(6))
    assert [e.address for e in fleet.serving("p")] == ["10.0.0.2:8000"]
    alone = fleet_of(clock, A)
    assert not any(alone.answered("p", "10.0.0.1:8000", True) for _ in range(6))
    # Probes still take every engine out: a pool that is down is down, and then it is
    # admitted against as configured (its breaker goes to L3 on `engines_up` 0).
    spec = Pool("p", (A, B), kv_capacity_tokens=1000)
    for _ in range(2):
        fleet.probed("p", "10.0.0.2:8000", False)
    assert fleet.serving("p") == [] and fleet.live_pool(spec) == spec


def test_an_engine_whose_batch_this_sidecar_filled_loses_its_pull() -> None:
    blocks = blocks_of(ids(*range(40)), ids(*range(40, 400)))
    home = candidate("a:1", 0, held_sequences=10, matched_tokens=380)  # its slots: 10
    other = candidate("b:1", 1, held_sequences=9)
    config = dataclasses.replace(CONFIG, load_bound=100.0)  # the bound alone would not move it
    assert pick([home, other], blocks, "0-4k", config)[0] == "b:1"
    assert (
        pick([dataclasses.replace(home, held_sequences=9), other], blocks, "0-4k", config)[0]
        == "a:1"
    )


def test_a_subset_hint_narrows_the_pick_and_a_fallbacks_answer_moves_the_hold() -> None:
    clock = FakeClock()
    policy = parse_policy({})
    fleet = fleet_of(clock, A, B, pool="default")
    picker = EnginePicker(fleet, lambda: policy, clock)
    spec = Pool("default", (A, B), kv_capacity_tokens=1000, max_num_seqs=8)
    blocks = blocks_of(np.arange(300, dtype=np.uint32), block_tokens=64)
    second = "10.0.0.2:8000"
    # Only the hinted engine is named, whatever the scores say.
    assert picker.pick("r1", spec, blocks, "0-4k", 120, 1, within={second}) == (second,)
    assert picker.eligible(spec, {second, "10.9.9.9:1"})
    assert not picker.eligible(spec, {"10.9.9.9:1"}) and not picker.eligible(spec, set())
    assert picker.pick("r2", spec, blocks, "0-4k", 120, 1, within=set()) == ()
    picker.release("r1")
    # The first named refused and the second served: the hold and the prefix go there.
    chosen = picker.pick("r3", spec, blocks, "0-4k", 120, 1)
    first, fallback = (fleet.get("default", address) for address in chosen)
    assert first is not None and fallback is not None
    picked = (first.picked, fallback.picked)
    picker.served("r3", chosen[1])
    assert (first.held_tokens, fallback.held_tokens) == (0, 120)
    assert (first.picked, fallback.picked) == picked  # it was sent to the first
    matched = picker.index("default").matched_tokens(blocks, [first.slot, fallback.slot])
    assert matched[1] == matched[0] > 0  # both now count as holding the prefix
    picker.served("r3", "10.9.9.9:1")  # not an engine of the pool: nothing moves
    picker.release("r3")
    assert fallback.held_tokens == 0 and fleet.holds == 0


@pytest.mark.parametrize("in_flight", [2, 4, 7])
def test_two_equal_engines_split_a_stream_of_new_conversations_evenly(in_flight: int) -> None:
    # The live run's shape: a few requests in flight at a time on two equal engines, each a
    # new conversation (nothing cached anywhere to pull it). Bounded load at ceil(1.25 x
    # the fair share) let 2 of 2 or 3 of 4 pile onto one engine by the conversations'
    # hashes, and the bucket's constant pull broke the load's ties towards one engine.
    clock = FakeClock()
    policy = parse_policy({})
    fleet = fleet_of(clock, A, B, pool="default")
    picker = EnginePicker(fleet, lambda: policy, clock)
    spec = Pool("default", (A, B), kv_capacity_tokens=20_000, max_num_seqs=32)
    rng = np.random.default_rng(5)
    system = rng.integers(0, 50_000, 200).astype(np.uint32)
    running: list[str] = []
    for number in range(400):
        if len(running) == in_flight:
            picker.release(running.pop(int(rng.integers(0, in_flight))))
        question = rng.integers(0, 50_000, 40).astype(np.uint32)
        blocks = blocks_of(system, question, block_tokens=64, head=2)
        picker.pick(f"r{number}", spec, blocks, "0-4k", tokens=300, sequences=1)
        running.append(f"r{number}")
        held = [e.held_sequences for e in fleet.engines("default")]
        assert max(held) - min(held) <= 1, (number, held)
    picked = [e.picked for e in fleet.engines("default")]
    assert min(picked) >= 0.45 * sum(picked), picked


def test_a_request_goes_only_to_an_engine_whose_cache_can_hold_it() -> None:
    clock = FakeClock()
    policy = parse_policy({})
    fleet = fleet_of(clock, A, B, pool="default")
    spec = Pool("default", (A, B), kv_capacity_tokens=16_000, max_num_seqs=8)
    assert fleet.largest_kv_tokens(spec) == 8_000  # the even share: none reported
    # One engine reports a larger cache: the largest serving engine's is what can be held.
    fleet.observe("default", "10.0.0.2:8000", EngineSnapshot(0.0, 0, 0, None, (), 12_000.0))
    assert fleet.largest_kv_tokens(spec) == 12_000
    picker = EnginePicker(fleet, lambda: policy, clock)
    rng = np.random.default_rng(9)
    for number in range(20):  # whatever its hash prefers, 10,000 tokens go to the larger one
        blocks = blocks_of(rng.integers(0, 50_000, 300).astype(np.uint32), block_tokens=64)
        chosen = picker.pick(f"r{number}", spec, blocks, "4-8k", tokens=10_000, sequences=1)
        assert chosen == ("10.0.0.2:8000",)
        picker.release(f"r{number}")
    for _ in range(2):  # the larger one dead: what is left holds 8,000
        fleet.probed("default", "10.0.0.2:8000", False)
    assert fleet.largest_kv_tokens(spec) == 8_000
    assert fleet.largest_kv_tokens(Pool("default", (A, B))) is None  # no size known


def test_the_buckets_pull_never_tips_a_load_difference_towards_the_busier_engine() -> None:
    # Two engines, one bucket: its pull is a constant tilt to one of them. With 3 requests
    # in flight, 2 on that engine, a 4th whose conversation also hashes there goes to the
    # other: the bucket's pull tied the load's difference (0.25 each) and the tie went to
    # the conversation's engine, 3 of 4 on one.
    busy = candidate("10.0.0.1:8000", 0, held_sequences=2)
    free = candidate("10.0.0.2:8000", 1, held_sequences=1)
    engines = [busy, free]
    bucket = next(
        b
        for b in (f"bucket-{i}" for i in range(100))
        if score([candidate(c.address, c.slot) for c in engines], NO_BLOCKS, b, CONFIG)[0].length
        == 1.0
    )
    key = next(
        b
        for b in (blocks_of(ids(i, i + 1)) for i in range(100))
        if rendezvous(b.key, busy.address) > rendezvous(b.key, free.address)
    )
    assert pick(engines, key, bucket, CONFIG)[0] == free.address


def test_an_exact_prefix_pulls_past_the_held_kv_that_counts_it_once_per_request() -> None:
    # llm-d's case in miniature: a customer's 600-token prefix and its 120-token question,
    # both the conversation's head. The engine whose KV events say it holds the prefix is one
    # request busier than the other, and "full" by the KV this sidecar holds there, which
    # counts the shared prefix once per request where the engine stores it once.
    blocks = blocks_of(ids(*range(600)), ids(*range(600, 720)), head=2)
    home = candidate("a:1", 0, held_tokens=1000, held_sequences=3, matched_tokens=600)
    other = candidate("b:1", 1, held_tokens=700, held_sequences=2)
    exact = dataclasses.replace(home, exact_prefix=True)
    assert pick([exact, other], blocks, "0-4k", CONFIG)[0] == "a:1"
    assert score([exact, other], blocks, "0-4k", CONFIG)[0].prefix == pytest.approx(600 / 720)
    # A guessed match (the approximate index) is scored as before: held back by the held KV.
    head_counted = dataclasses.replace(CONFIG, affinity_weight=0, length_weight=0)
    guessed = dataclasses.replace(blocks, head_tokens=0)
    assert score([home, other], guessed, "0-4k", head_counted)[0].prefix == 0.0
    assert pick([home, other], guessed, "0-4k", head_counted)[0] == "b:1"
    # Its batch full, or at twice the bounded share (7 of 10 in flight on 4 engines:
    # ceil(2.5 x 11 / 4) = 7), the exact match pulls no more either: a hot prefix spills over.
    full = dataclasses.replace(exact, held_sequences=10)
    assert score([full, other], blocks, "0-4k", CONFIG)[0].prefix == 0.0
    hot = dataclasses.replace(exact, held_tokens=0, held_sequences=7)
    rest = [candidate(f"c:{i}", i, held_sequences=1) for i in range(1, 4)]
    assert score([hot, *rest], blocks, "0-4k", CONFIG)[0].prefix == 0.0
    assert score([dataclasses.replace(hot, held_sequences=6), *rest], blocks, "0-4k", CONFIG)[
        0
    ].prefix == pytest.approx(600 / 720)


def test_what_requests_read_of_a_pool_follows_every_change_of_its_engines() -> None:
    """The pool's serving engines, its live capacity and its largest engine are kept between
    requests (EngineFleet.view): each is asked before and after every kind of change, the
    clock reaching an ejection's end included, which no call announces."""
    clock = FakeClock()
    fleet = EngineFleet(lambda: HEALTH, clock, window_s=lambda: 20.0)
    fleet.sync("p", [A, B])
    spec = Pool("p", (A, B, C), kv_capacity_tokens=1200, max_num_seqs=12)
    a, b, c = (engine_address(*e) for e in (A, B, C))

    def read() -> tuple[list[str], int | None, int | None, float | None, frozenset[str]]:
        live = fleet.live_pool(spec)
        serving = [e.address for e in fleet.serving("p")]
        truth = [e.address for e in fleet.engines("p") if fleet.state(e) is EngineState.SERVING]
        assert serving == truth
        largest = fleet.largest_kv_tokens(spec)
        return serving, live.kv_capacity_tokens, live.max_num_seqs, largest, fleet.out("p")

    assert read() == ([a, b], 1200, 12, 600.0, frozenset())
    fleet.hold("r1", "p", a, 100, 1)
    assert [fleet.answered("p", a, failed=True) for _ in range(3)][-1]  # ejected
    assert read() == ([b], 600 + 100, 6 + 1, 600.0, {a})
    clock.now_s += HEALTH.eject_s  # its ejection ends: nothing but the clock says so
    assert read() == ([a, b], 1200, 12, 600.0, {a})  # back, its failures still in the window
    clock.now_s += 20.0
    assert read() == ([a, b], 1200, 12, 600.0, frozenset())
    fleet.observe("p", b, EngineSnapshot(0.5, 1, 0, None, (), 4000.0))
    assert read() == ([a, b], 600 + 4000, 12, 4000.0, frozenset())
    assert fleet.sync("p", [A, B, C]) == [f"+{c}"]
    assert read() == ([a, b, c], 400 + 4000 + 400, 12, 4000.0, frozenset())
    fleet.drain(a, True)
    assert read() == ([b, c], 4000 + 400 + 100, 4 + 4 + 1, 4000.0, {a})
    fleet.drain(a, False)
    for _ in range(HEALTH.unhealthy_after):
        fleet.probed("p", b, False)
    assert read() == ([a, c], 400 + 400, 8, 400.0, {b})
    for _ in range(HEALTH.healthy_after):
        fleet.probed("p", b, True)
    assert read() == ([a, b, c], 4800, 12, 4000.0, {b})  # back lately: out of the signals
    fleet.release("r1")
    assert fleet.sync("p", [B]) == [f"-{a}", f"-{c}"]
    assert read() == ([b], 4000, 12, 4000.0, frozenset())  # one engine: never out


def test_an_engine_back_from_the_dead_is_picked_with_its_prefix_forgotten() -> None:
    clock = FakeClock()
    policy = parse_policy({})
    fleet = fleet_of(clock, A, B, pool="default")
    picker = EnginePicker(fleet, lambda: policy, clock)
    spec = Pool("default", (A, B), kv_capacity_tokens=1000, max_num_seqs=8)
    blocks = blocks_of(np.arange(300, dtype=np.uint32), block_tokens=64)
    first = picker.pick("r1", spec, blocks, "0-4k", tokens=120, sequences=1)[0]
    picker.release("r1")
    matched = {c.address: c.matched_tokens for c in picker.candidates(spec, blocks)}
    assert matched[first] == 300
    for _ in range(HEALTH.unhealthy_after):
        fleet.probed("default", first, False)
    assert [c.address for c in picker.candidates(spec, blocks)] != [first]
    for _ in range(HEALTH.healthy_after):
        fleet.probed("default", first, True)
    matched = {c.address: c.matched_tokens for c in picker.candidates(spec, blocks)}
    assert matched == {engine_address(*A): 0, engine_address(*B): 0}  # its cache is empty
