"""The waiting room on a virtual clock: what waits and what is refused at once, the order
(strict priority, fair shares, FIFO within a tenant, no starvation), the bounds, and that a
request that leaves holds nothing. The same KvStep runs with asyncio futures (the sidecar)
and with the simulator's waiters (sim.fleet.sidecar.drive)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from admission.assembly import build_admission
from admission.decision import Applicant, RoutingDecision
from admission.errors import Overloaded, RateLimited, RequestRejected
from admission.events import NoEvents
from admission.kv.step import KvStep
from admission.waiting_room import (
    MAX_MISSES,
    AttainedService,
    RoomBounds,
    Waiting,
    WaitingRoom,
    WaitNotice,
)
from budget.store import InProcessStore
from policy.domain import Limits, Tier
from policy.loader import parse_policy
from policy.schema import Policy
from sim.fleet.fleet_runs import run_once, with_kv_admission
from sim.fleet.run_summary import jain_index
from sim.fleet.sidecar import SimWaiter, drive, run_now
from sim.fleet.workload_files import SIMULATION_POLICY, WORKLOADS, load_workload
from tests.support.clock import VirtualClock
from tests.support.decisions import caller, decision, outcome


def room_policy(slots: int = 2, **room: Any) -> Policy:
    return parse_policy(
        {
            "pools": {
                "default": {"endpoints": ["127.0.0.1:1"], "max_num_seqs": slots},
                "long": {"endpoints": ["127.0.0.1:2"]},
                "fallback": {"endpoints": ["127.0.0.1:3"]},
            },
            # Every tier may fill every slot: the order, not the shares, is under test.
            "breaker": {"kv_shares": {"critical": 1.0, "standard": 1.0, "sheddable": 1.0}},
            "waiting_room": {"max_wait_s": {"critical": 2.0}, **room},
        }
    )


class Events(NoEvents):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def waited(self, tier: str, outcome: str, seconds: float) -> None:
        self.seen.append((tier, outcome))


class Room:
    """A KvStep with asyncio futures on a virtual clock, and what each request got."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.clock = VirtualClock()
        self.events = Events()
        self.kv = KvStep(
            self.events,
            self.clock,
            ttl_s=660,
            policy=lambda: self.policy,
            new_waiter=lambda: asyncio.get_running_loop().create_future(),
            wait_cap_s=policy.longest_wait_s,
        )
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.order: list[str] = []  # admitted, in order
        self.decisions: dict[str, RoutingDecision] = {}
        self.admitted: dict[str, RoutingDecision] = {}  # as admitted

    async def send(
        self,
        rid: str,
        tier: Tier = Tier.STANDARD,
        tenant: str = "t",
        on_wait: WaitNotice | None = None,
        **kw: Any,
    ) -> None:
        d = dataclasses.replace(
            decision(kw.pop("context", 1000), tier=tier, policy=self.policy, **kw),
            caller=caller(tier, tenant=tenant, key=tenant[0]),
        )
        self.decisions[rid] = d

        async def admit() -> None:
            admitted = await self.kv.admit(Applicant(d, rid, self.policy, on_wait))
            self.admitted[rid] = admitted.decision
            self.order.append(rid)

        self.tasks[rid] = asyncio.create_task(admit())
        await asyncio.sleep(0)  # let it reach the ledger or the room

    async def end(self, rid: str, completion_tokens: int = 10) -> None:
        await self.kv.settle(outcome(self.decisions[rid], rid, completion_tokens=completion_tokens))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    def error(self, rid: str) -> BaseException | None:
        task = self.tasks[rid]
        return task.exception() if task.done() and not task.cancelled() else None


async def test_a_full_pool_makes_requests_wait_and_each_end_lets_the_next_in() -> None:
    room = Room(room_policy(slots=2))
    for rid in ("a", "b", "c", "d"):
        await room.send(rid, Tier.CRITICAL)
    assert room.order == ["a", "b"] and len(room.kv.dispatcher.room) == 2
    await room.end("a")
    assert room.order == ["a", "b", "c"]
    await room.end("b")
    assert room.order == ["a", "b", "c", "d"] and len(room.kv.dispatcher.room) == 0
    assert room.events.seen.count(("critical", "dispatched")) == 2


async def test_a_large_request_leaving_no_room_for_another_is_settled_promptly() -> None:
    """Its end frees what the next one needs: marked, so its access-log entry is sent at
    once (not batched), as is every large request that waited for room."""
    room = Room(room_policy(slots=3))
    for rid in ("a", "b", "c", "d"):
        await room.send(rid, Tier.CRITICAL)
    assert room.order == ["a", "b", "c"]
    marked = {rid: d.settle_promptly for rid, d in room.admitted.items()}
    assert marked == {"a": False, "b": False, "c": True}
    await room.end("a")
    assert room.order[-1] == "d" and room.admitted["d"].settle_promptly
    # A sixteenth of the pool each: freed late, one blocks little; batched, even when full.
    small = Room(room_policy(slots=16))
    for rid in range(17):
        await small.send(str(rid), Tier.CRITICAL)
    await small.end("0")
    assert len(small.admitted) == 17
    assert not any(d.settle_promptly for d in small.admitted.values())


async def test_strict_priority_between_tiers() -> None:
    room = Room(room_policy(slots=1))
    await room.send("first", Tier.STANDARD)
    await room.send("shed", Tier.SHEDDABLE)
    await room.send("std", Tier.STANDARD)
    await room.send("crit", Tier.CRITICAL)
    for rid in ("first", "crit", "std"):
        await room.end(rid)
    assert room.order == ["first", "crit", "std", "shed"]


async def test_inside_a_tier_the_tenant_with_least_attained_service_goes_first() -> None:
    room = Room(room_policy(slots=1))
    # Tenant "heavy" already used the pool a lot; "light" barely.
    room.kv.dispatcher.room.service.add("heavy", 50_000, room.clock())
    room.kv.dispatcher.room.service.add("light", 1_000, room.clock())
    await room.send("busy", tenant="other")
    await room.send("h1", tenant="heavy")
    await room.send("h2", tenant="heavy")
    await room.send("l1", tenant="light")
    await room.send("l2", tenant="light")
    for rid in ("busy", "l1", "l2", "h1"):
        await room.end(rid)
    # light goes while its attained service stays below heavy's; FIFO inside each tenant
    assert room.order == ["busy", "l1", "l2", "h1", "h2"]


async def test_attained_service_decays_with_the_half_life() -> None:
    service = AttainedService(half_life_s=60)
    service.add("a", 1000, 0.0)
    assert service.value("a", 60.0) == pytest.approx(500)
    assert service.value("a", 120.0) == pytest.approx(250)
    service.add("a", -10_000, 120.0)
    assert service.value("a", 120.0) == 0.0  # never negative


async def test_settling_corrects_the_service_to_what_was_generated() -> None:
    room = Room(room_policy(slots=4))
    await room.send("a", tenant="t", context=1100, max_tokens=1000)  # prompt 100
    charged = room.kv.dispatcher.room.service.value("t", room.clock())
    assert charged == pytest.approx(100 + 2 * 1000)  # output weighs 2x
    await room.end("a", completion_tokens=50)  # one second later, by the outcome's duration
    after = room.kv.dispatcher.room.service.value("t", room.clock())
    assert after == pytest.approx(100 + 2 * 1000 - 2 * 950 * 0.5 ** (1 / 60), rel=1e-6)


async def churn(room: Room, ends: int) -> None:
    """`ends` requests that come and go: the pool's drain rate over the last 10 s."""
    for i in range(ends):
        await room.send(f"churn{i}", Tier.CRITICAL, tenant="c")
        await room.end(f"churn{i}")


async def test_backfill_lets_small_requests_pass_a_blocked_head_only_for_a_while() -> None:
    """The head needs 3 slots (n=3); singles behind it fit one slot each. They may pass it
    while it has waited less than backfill_s; then nothing passes it until it fits, since
    the pool gives slots back fast enough (6 a second) for its room to come within hold_s."""
    room = Room(room_policy(slots=4, backfill_s=0.5))
    await churn(room, 60)
    for rid in ("r1", "r2", "r3"):
        await room.send(rid, Tier.CRITICAL)
    await room.send("big", Tier.CRITICAL, tenant="b", sequences=3)
    await room.send("s1", Tier.CRITICAL, tenant="x")
    await room.send("s2", Tier.CRITICAL, tenant="y")
    assert room.order[-4:] == ["r1", "r2", "r3", "s1"]  # s1 backfilled past the blocked head
    room.clock.advance(0.6)  # the head has now waited past the bound
    await room.end("r1")
    assert room.order[-1] == "s1"  # s2 may not pass it any more
    await room.end("r2")
    await room.end("r3")
    assert room.order[-1] == "big"  # three slots free: the head first
    await room.end("s1")
    assert room.order[-1] == "s2"


async def test_the_pool_is_not_held_for_a_head_whose_room_is_not_about_to_come() -> None:
    """The same line, in a pool that gave back one slot in the last 10 s: the head's two
    missing slots would take 20 s, so holding the pool for it would only idle it."""
    room = Room(room_policy(slots=4, backfill_s=0.5))
    for rid in ("r1", "r2", "r3"):
        await room.send(rid, Tier.CRITICAL)
    await room.send("big", Tier.CRITICAL, tenant="b", sequences=3)
    await room.send("s1", Tier.CRITICAL, tenant="x")
    await room.send("s2", Tier.CRITICAL, tenant="y")
    room.clock.advance(0.6)
    await room.end("r1")
    assert room.order[-1] == "s2"  # passed the head: its room was not about to come
    # the head still waits, until room comes or its deadline
    assert len(room.kv.dispatcher.room) == 1


async def test_a_tenants_small_requests_pass_its_own_blocked_large_one() -> None:
    """FIFO within a tenant, but one long prompt must not freeze the tenant's short ones."""
    room = Room(room_policy(slots=4, backfill_s=0.5))
    for rid in ("r1", "r2", "r3"):
        await room.send(rid, Tier.CRITICAL, tenant="other")
    await room.send("big", Tier.CRITICAL, tenant="t", sequences=3)
    await room.send("small", Tier.CRITICAL, tenant="t")
    assert room.order[-1] == "small" and len(room.kv.dispatcher.room) == 1


async def test_budget_and_breaker_refusals_never_wait() -> None:
    policy = room_policy(slots=1)
    clock = VirtualClock()
    admission = build_admission(
        board=None,
        store=InProcessStore(clock),
        events=NoEvents(),
        clock=clock,
        ttl_s=660,
        policy=lambda: policy,
        new_waiter=lambda: asyncio.get_running_loop().create_future(),
    )
    rich = caller(Tier.CRITICAL, tenant="rich", key="r")
    poor = caller(Tier.CRITICAL, tenant="poor", key="p", limits=Limits(tokens_per_minute=10))
    await admission.chain.admit(
        Applicant(dataclasses.replace(decision(1000, policy=policy), caller=rich), "a", policy)
    )
    with pytest.raises(RateLimited):  # the pool is full, but the budget says no first
        await admission.chain.admit(
            Applicant(dataclasses.replace(decision(1000, policy=policy), caller=poor), "b", policy)
        )
    assert len(admission.kv.dispatcher.room) == 0


async def test_a_request_that_could_never_fit_is_refused_at_once() -> None:
    room = Room(room_policy(slots=2))
    with pytest.raises(Overloaded) as refused:
        await room.kv.admit(
            Applicant(decision(1000, policy=room.policy, sequences=3), "n3", room.policy)
        )
    assert refused.value.reason == "sequences_full" and len(room.kv.dispatcher.room) == 0


async def test_a_wait_past_its_tier_bound_times_out_with_retry_after() -> None:
    room = Room(room_policy(slots=1))
    await room.send("busy", Tier.CRITICAL)
    await room.send("late", Tier.CRITICAL)
    room.clock.advance(1.9)
    await room.kv.dispatcher.tick()
    await asyncio.sleep(0)
    assert room.error("late") is None and len(room.kv.dispatcher.room) == 1
    room.clock.advance(0.2)  # critical may wait 2 s here
    await room.kv.dispatcher.tick()
    await asyncio.sleep(0)
    error = room.error("late")
    assert isinstance(error, Overloaded) and error.reason == "queue_timeout"
    assert error.retry_after_s is not None and error.retry_after_s >= 1
    assert room.kv.book.holds == 1 and len(room.kv.dispatcher.room) == 0
    assert ("critical", "timed_out") in room.events.seen


async def test_a_full_room_refuses_with_queue_full_by_count_and_by_bytes() -> None:
    room = Room(room_policy(slots=1, max_waiting=2, max_waiting_bytes=10_000))
    await room.send("busy")
    await room.send("w1", body_bytes=4000)
    await room.send("w2", body_bytes=4000)
    await room.send("w3", body_bytes=10)  # a third standard request: over max_waiting
    error = room.error("w3")
    assert isinstance(error, Overloaded) and error.reason == "queue_full"
    await room.send("c1", Tier.CRITICAL, body_bytes=4000)  # its own count, but the bytes
    error = room.error("c1")
    assert isinstance(error, Overloaded) and error.reason == "queue_full"
    assert "bodies" in error.message and room.kv.dispatcher.room.bytes == 8000


async def test_the_retry_after_of_a_full_room_follows_how_fast_the_pool_drains() -> None:
    room = Room(room_policy(slots=1, max_waiting=3))
    for i in range(10):  # ten requests end within the 10 s window: 1 end/s
        await room.send(f"r{i}")
        await room.end(f"r{i}")
    await room.send("busy")
    for i in range(3):
        await room.send(f"w{i}")
    await room.send("over")
    error = room.error("over")
    assert isinstance(error, Overloaded) and error.reason == "queue_full"
    assert error.retry_after_s == 4  # three waiting ahead, and itself, at one end a second
    room.clock.advance(11)  # nothing ended for a while: the tier's longest wait
    await room.send("later")
    error = room.error("later")
    assert isinstance(error, Overloaded) and error.retry_after_s == 15


async def test_a_client_gone_while_waiting_leaves_at_once_and_holds_nothing() -> None:
    room = Room(room_policy(slots=1))
    await room.send("busy")
    await room.send("gone")
    room.tasks["gone"].cancel()
    await asyncio.sleep(0)
    assert room.tasks["gone"].cancelled() and len(room.kv.dispatcher.room) == 0
    assert ("standard", "cancelled") in room.events.seen
    await room.end("busy")
    assert room.kv.book.holds == 0


async def test_gone_after_dispatch_but_before_resuming_gives_the_slot_back() -> None:
    room = Room(room_policy(slots=1))
    await room.send("busy")
    await room.send("next")
    await room.kv.settle(outcome(room.decisions["busy"], "busy"))  # dispatches "next"
    assert room.kv.book.holds == 1  # held for "next", which has not resumed yet
    room.tasks["next"].cancel()
    await asyncio.sleep(0)
    assert room.kv.book.holds == 0 and room.order == ["busy"]


async def test_a_lower_ratio_or_a_reload_dispatches_the_room() -> None:
    room = Room(room_policy(slots=1))
    await room.send("busy")
    await room.send("w")
    room.policy = room_policy(slots=2)  # a reload with more batch slots
    await room.kv.dispatcher.dispatch()
    await asyncio.sleep(0)
    assert room.order == ["busy", "w"]


async def test_the_transport_is_told_how_long_a_request_may_wait() -> None:
    room = Room(room_policy(slots=1))
    await room.send("busy", Tier.CRITICAL)
    told: list[float] = []
    await room.send("w", Tier.CRITICAL, on_wait=told.append)
    assert told == [2.0]


async def test_critical_waits_derive_from_its_slo_minus_the_expected_prefill() -> None:
    policy = parse_policy(
        {
            "slos": {"critical": {"default": 2000}},
            "latency_model": {"default": {"base_latency_ms": 100, "prefill_ms_per_1k_tokens": 50}},
        }
    )
    assert policy.max_wait_s(Tier.CRITICAL, "default", "0-4k", 2000) == pytest.approx(1.8)
    assert policy.max_wait_s(Tier.CRITICAL, "long", "0-4k", 2000) == pytest.approx(1.0)  # no model
    # standard: a quarter of what its 4 s SLO leaves after the 200 ms prefill
    assert policy.max_wait_s(Tier.STANDARD, "default", "0-4k", 2000) == pytest.approx(0.95)
    fixed = parse_policy({"waiting_room": {"max_wait_s": {"sheddable": 30}}})
    assert fixed.max_wait_s(Tier.SHEDDABLE, "default", "0-4k", 2000) == 30.0
    no_room = parse_policy({"waiting_room": {"enabled": False}})
    assert no_room.max_wait_s(Tier.CRITICAL, "default", "0-4k", 2000) == 0.0


def test_the_simulators_waiters_run_the_same_room() -> None:
    """sim.fleet.sidecar.drive suspends an admission on a SimWaiter and resumes it when the room
    dispatches it: the same order as with asyncio futures."""
    policy = room_policy(slots=1)
    clock = VirtualClock()
    queue: list[Callable[[], None]] = []
    kv = KvStep(NoEvents(), clock, 660, lambda: policy, lambda: SimWaiter(queue.append))
    got: list[str] = []

    def send(rid: str, tier: Tier) -> None:
        d = dataclasses.replace(decision(1000, tier=tier, policy=policy), caller=caller(tier))

        def done(result: object, rid: str = rid) -> None:
            got.append(rid if not isinstance(result, RequestRejected) else f"{rid}:{result.reason}")

        drive(kv.admit(Applicant(d, rid, policy)), done)

    send("busy", Tier.STANDARD)
    send("shed", Tier.SHEDDABLE)
    send("crit", Tier.CRITICAL)
    assert got == ["busy"]
    for rid in ("busy", "crit"):
        run_now(kv.book.release(rid))
        run_now(kv.dispatcher.dispatch())
        while queue:
            queue.pop(0)()
    assert got == ["busy", "crit", "shed"]
    clock.advance(100)
    send("late", Tier.SHEDDABLE)
    clock.advance(31)
    run_now(kv.dispatcher.tick())
    while queue:
        queue.pop(0)()
    assert got[-1] == "late:queue_timeout"


def test_jain_index_is_one_for_max_min_fair_service_and_lower_when_a_tenant_is_starved() -> None:
    fair = {"steady": {"requests": 100, "served": 100}, "flood": {"requests": 1000, "served": 400}}
    assert jain_index(fair) == 1.0  # steady got all it asked, flood the rest
    starved = {
        "steady": {"requests": 100, "served": 20},
        "flood": {"requests": 1000, "served": 480},
    }
    assert jain_index(starved) < 0.8


def test_the_offline_fleet_waits_instead_of_refusing_and_clients_retry_after_refusals() -> None:
    """A small pool and a burst: refused at once, critical requests are lost; with the room
    they wait and are served; clients that retry come back after Retry-After."""
    workload = with_kv_admission(load_workload(WORKLOADS / "burst-10x.yaml", SIMULATION_POLICY))
    short = dataclasses.replace(
        workload, arrivals=[a for a in workload.arrivals if a.at_s < 150], duration_s=150
    )
    refusing = run_once(short, 7, controller=True, waiting_room=False)
    waiting = run_once(short, 7, controller=True, waiting_room=True, client_retries=2)
    refused, room = refusing["waiting_room"]["tiers"], waiting["waiting_room"]["tiers"]
    assert refused["standard"]["refused_for_capacity"] > 20  # the launch burst meets a full pool
    # ... and mostly waits instead (its wait is a quarter of what its SLO leaves)
    assert (
        room["standard"]["refused_for_capacity"] < refused["standard"]["refused_for_capacity"] / 4
    )
    # sheddable waits a quarter of what its SLO leaves, then is refused (and retries)
    assert room["sheddable"]["refused_for_capacity"] < refused["sheddable"]["refused_for_capacity"]
    assert room["critical"]["refused_for_capacity"] == 0
    assert room["standard"]["wait_p99_s"] > 0 and refused["standard"]["wait_p99_s"] == 0
    assert room["sheddable"]["retried"] > 0 and refused["sheddable"]["retried"] == 0


def test_a_dispatch_pass_is_bounded_when_nothing_fits() -> None:
    """Thousands waiting in a full pool: each end of a request checks a bounded number."""
    room = WaitingRoom(AttainedService(60))
    clock = VirtualClock()
    for i in range(2000):
        entry = Waiting(
            f"w{i}",
            "p",
            Tier.STANDARD,
            f"t{i % 50}",
            100,
            1,
            False,
            0,
            100.0,
            clock(),
            clock() + 10,
            SimWaiter(lambda _: None),
        )
        room.enter(entry, RoomBounds(5000, 1 << 30))
    offered: list[str] = []

    async def fits(entry: Waiting) -> bool:
        offered.append(entry.request_id)
        return False

    assert run_now(room.dispatch("p", fits, clock(), backfill_s=0.5, weights={})) == []
    assert len(offered) == MAX_MISSES + 1 and len(room) == 2000
