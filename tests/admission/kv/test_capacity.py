"""KV admission's pure ledger: footprints, the engine ratio, tier shares and batch slots.

The gate through the real stack: tests/e2e/admission/kv/test_capacity.py."""

from __future__ import annotations

import dataclasses

import pytest

from admission.kv.capacity import KvLedger, PoolCapacity, kv_footprint, pool_capacity
from policy.loader import parse_policy


def test_footprint_weights_the_context_by_its_bucket() -> None:
    policy = parse_policy({})
    assert kv_footprint(1000, policy.bucket_for(1000)) == 1000
    assert kv_footprint(20_000, policy.bucket_for(20_000)) == 84_000  # 8-32k: 4.2x


def test_the_ratio_rises_past_one_only_when_the_engine_stays_fuller() -> None:
    ledger = KvLedger()
    cache = PoolCapacity(kv_tokens=10_000, sequences=None)
    assert ledger.admit("a", "p", 2000, cache, share=1.0).admitted
    ledger.observe("p", 0.6, 10_000)  # the engine holds 6000 of a counted 2000: once
    assert ledger.ratio["p"] == 1.0  # one reading may be scrape lag
    ledger.observe("p", 0.5, 10_000)
    ledger.observe("p", 0.7, 10_000)  # three in a row: 3x, 2.5x, 3.5x
    assert ledger.ratio["p"] == pytest.approx(2.5)  # the smallest of them
    # What is in flight now counts 2.5x: 2000 more fits (4000 -> 10000), 2500 does not.
    assert not ledger.admit("b", "p", 2500, cache, share=1.0).admitted
    assert ledger.admit("c", "p", 2000, cache, share=1.0).admitted
    ledger.observe("p", 1.0, 10_000)
    assert ledger.ratio["p"] <= KvLedger.max_ratio


def test_requests_that_run_to_their_limit_are_never_discounted() -> None:
    ledger = KvLedger()
    cache = PoolCapacity(kv_tokens=10_000, sequences=None)
    for i in range(3):
        assert ledger.admit(f"r{i}", "p", 1000, cache, share=1.0).admitted
    ledger.observe("p", 0.03, 10_000)  # the engine holds a tenth of what was counted
    for _ in range(60):
        ledger.observe("p", 0.03, 10_000)
    assert ledger.ratio["p"] == pytest.approx(0.1, rel=0.05)
    # An ignore_eos request of 8000 counts in full: 3000 x 0.1 + 8000 > 8000 ... fits 10000.
    assert ledger.admit("fixed", "p", 8000, cache, share=1.0, fixed=True).admitted
    assert ledger.expected("p") == pytest.approx(3000 * ledger.ratio["p"] + 8000)
    assert not ledger.admit("fixed2", "p", 2000, cache, share=1.0, fixed=True).admitted
    assert ledger.release("fixed") and ledger.fixed["p"] == 0


def test_parallel_completions_take_a_batch_slot_each() -> None:
    ledger = KvLedger()
    slots = PoolCapacity(kv_tokens=None, sequences=10)
    assert ledger.admit("n8", "p", 10, slots, share=1.0, sequences=8).admitted
    assert not ledger.admit("n4", "p", 10, slots, share=1.0, sequences=4).admitted
    assert ledger.requests["p"] == 8
    assert ledger.release("n8") and ledger.requests["p"] == 0


def test_each_tier_fills_the_pool_up_to_its_share() -> None:
    ledger = KvLedger()
    cache = PoolCapacity(kv_tokens=1000, sequences=None)
    assert ledger.admit("a", "p", 800, cache, share=0.85).admitted
    refused = ledger.admit("b", "p", 100, cache, share=0.85)
    assert not refused.admitted and refused.limit == "kv_cache"
    assert refused.in_flight_tokens == 800 and refused.in_flight_requests == 1
    assert ledger.admit("c", "p", 100, cache, share=1.0).admitted  # critical: the top 15%
    assert ledger.admit("d", "other", 900, cache, share=0.95).admitted
    assert ledger.release("a") and not ledger.release("a")  # released once
    assert not ledger.release("b")  # never admitted: nothing to give back
    assert ledger.in_flight == {"p": 100, "other": 900}
    assert ledger.requests == {"p": 1, "other": 1}


def test_the_ledger_learns_what_the_engine_really_holds() -> None:
    ledger = KvLedger()
    cache = PoolCapacity(kv_tokens=10_000, sequences=None)
    for i in range(4):  # 4 x 2000 counted (prompt + max_tokens), the engine holds 25% of it
        assert ledger.admit(f"r{i}", "p", 2000, cache, share=0.85).admitted
    assert not ledger.admit("x", "p", 2000, cache, share=0.85).admitted  # 10000 > 8500
    ledger.observe("p", engine_kv_usage=0.2, capacity_tokens=10_000)  # 2000 real of 8000
    assert ledger.ratio["p"] == pytest.approx(1.0 + 0.1 * (0.25 - 1.0))  # down slowly
    for _ in range(60):
        ledger.observe("p", engine_kv_usage=0.2, capacity_tokens=10_000)
    assert ledger.ratio["p"] == pytest.approx(0.25, rel=0.01)
    assert ledger.admit("x", "p", 2000, cache, share=0.85).admitted  # 10000 x 0.25 fits
    ledger.observe("p", engine_kv_usage=0.6, capacity_tokens=10_000)  # fuller than thought
    assert ledger.ratio["p"] == pytest.approx(0.6)  # up at once
    ledger.observe("p", engine_kv_usage=1.0, capacity_tokens=10_000)  # stale metrics
    assert ledger.ratio["p"] == 1.0
    ledger.observe("p", engine_kv_usage=None, capacity_tokens=10_000)
    assert ledger.ratio["p"] == 1.0
    quiet = KvLedger()  # too little in flight to learn anything
    quiet.admit("q", "p", 100, cache, share=1.0)
    quiet.observe("p", engine_kv_usage=0.001, capacity_tokens=10_000)
    assert quiet.ratio.get("p", 1.0) == 1.0


def test_batch_slots_are_shared_by_tier_too() -> None:
    ledger = KvLedger()
    slots = PoolCapacity(kv_tokens=None, sequences=10)
    admitted = [ledger.admit(f"s{i}", "p", 1, slots, share=0.85).admitted for i in range(10)]
    assert admitted == [True] * 8 + [False] * 2  # sheddable: 8 of 10 slots
    assert ledger.admit("c1", "p", 1, slots, share=1.0).admitted  # critical: the rest
    assert ledger.admit("c2", "p", 1, slots, share=1.0).admitted
    refused = ledger.admit("c3", "p", 1, slots, share=1.0)
    assert not refused.admitted and refused.limit == "sequences"
    policy = parse_policy({})
    unlimited = policy.pools["default"]
    assert pool_capacity(unlimited) is None  # nothing declared: no admission at all
    declared = dataclasses.replace(unlimited, kv_capacity_tokens=9000, max_num_seqs=300)
    assert pool_capacity(declared, replicas=3) == PoolCapacity(3000, 100)
