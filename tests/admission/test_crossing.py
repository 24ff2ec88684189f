"""Crossing regions, pure: where a saturated pool's request goes (admission.crossing), and
the admission chain re-routing it there from the breaker and the KV steps, charged at the
origin only."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from admission.assembly import build_admission
from admission.crossing import (
    Crossing,
    NoPeers,
    RoundTrips,
    Skip,
    cross_to,
    crossed_to,
    crossing_pool,
)
from admission.decision import Applicant
from admission.errors import Overloaded, RateLimited, Shed
from admission.events import NoEvents
from admission.waiting_room import Waiter
from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel
from budget.leases import PoolRoom
from budget.store import InProcessStore
from policy._reader import PolicyError
from policy.domain import Limits, Tier
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.clock import VirtualClock
from tests.support.decisions import caller, decision, outcome


def regions_policy(**crossing: Any) -> Policy:
    return parse_policy(
        {
            "pools": {
                "default": {"endpoints": ["127.0.0.1:1"], "kv_capacity_tokens": 10_000},
                "long": {"endpoints": ["127.0.0.1:2"]},
                "fallback": {"endpoints": ["127.0.0.1:3"]},
            },
            "regions": {
                "this": "eu",
                "list": {
                    "eu": {"ingress": "127.0.0.1:10000"},
                    "us": {"ingress": "127.0.0.1:10001"},
                    "ap": {"ingress": "127.0.0.1:10002"},
                    "dark": {},  # takes no crossing traffic: no ingress
                },
                "ledger": {"url": "redis://127.0.0.1:1/0"},
                "crossing": {
                    "enabled": True,
                    "secret_file": "/dev/null",
                    "tenants": ["night-batch"],
                    **crossing,
                },
            },
            "waiting_room": {"max_waiting": 1},
        }
    )


POLICY = regions_policy()


ROOMY = {"default": PoolRoom(0, False)}


class Links:
    def __init__(self, **rtt_ms: float) -> None:
        self.rtt_ms = rtt_ms

    def rtt_s(self, peer: str) -> float | None:
        ms = self.rtt_ms.get(peer)
        return None if ms is None else ms / 1000


class Rooms:
    def __init__(self, peers: Mapping[str, Mapping[str, PoolRoom]]) -> None:
        self.rooms = peers

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        return self.rooms


class Skips:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def crossing_skipped(self, reason: str) -> None:
        self.seen.append(reason)


def choose(
    *,
    tier: Tier = Tier.SHEDDABLE,
    tenant: str = "t",
    level: int = 2,
    waiting_full: bool = False,
    may_cross: bool = True,
    peers: Mapping[str, Mapping[str, PoolRoom]] | None = None,
    links: Links | None = None,
    policy: Policy = POLICY,
) -> tuple[str | None, Skip | None]:
    choice = cross_to(
        regions=policy.regions,
        this="eu",
        pool="default",
        tier=tier,
        tenant=tenant,
        may_cross=may_cross,
        level=level,
        waiting_full=waiting_full,
        peers={"us": ROOMY, "ap": ROOMY} if peers is None else peers,
        links=links or Links(us=80, ap=40),
    )
    return choice.peer, choice.skipped


def test_a_saturated_pools_tolerant_request_goes_to_the_nearest_peer_with_room() -> None:
    assert choose() == ("ap", None)
    assert choose(links=Links(us=80, ap=120)) == ("us", None)
    # Saturated by its waiting room alone (level below from_level) crosses too.
    assert choose(level=0, waiting_full=True) == ("ap", None)


def test_a_pool_with_room_keeps_its_requests_and_counts_nothing() -> None:
    assert choose(level=1) == (None, None)
    assert choose(level=1, policy=regions_policy(from_level=1)) == ("ap", None)
    off = regions_policy(enabled=False)
    assert choose(policy=off) == (None, None)


@pytest.mark.parametrize(
    ("tier", "tenant", "expected"),
    [
        (Tier.SHEDDABLE, "t", "ap"),  # the default tolerant tier
        (Tier.STANDARD, "t", None),
        (Tier.CRITICAL, "t", None),
        (Tier.CRITICAL, "night-batch", "ap"),  # listed by name: crosses whatever its tier
    ],
)
def test_only_tolerant_tiers_and_listed_tenants_cross(
    tier: Tier, tenant: str, expected: str | None
) -> None:
    peer, skipped = choose(tier=tier, tenant=tenant)
    assert peer == expected
    assert skipped == (None if expected else Skip.NOT_TOLERANT)


def test_the_critical_tier_is_never_tolerant_by_its_tier() -> None:
    with pytest.raises(PolicyError, match="critical tier never crosses"):
        regions_policy(tiers=["sheddable", "critical"])
    assert choose(tier=Tier.STANDARD, policy=regions_policy(tiers=["standard"])) == ("ap", None)


def test_a_request_that_crossed_never_crosses_again() -> None:
    assert choose(may_cross=False) == (None, Skip.ALREADY_CROSSED)


@pytest.mark.parametrize(
    ("peers", "skipped"),
    [
        ({}, Skip.NO_PEER_ROOM),  # nothing fresh reported (the agent's stale lease: empty)
        ({"us": {"default": PoolRoom(2, False)}}, Skip.NO_PEER_ROOM),  # saturated there too
        ({"us": {"default": PoolRoom(0, True)}}, Skip.NO_PEER_ROOM),
        ({"us": {"long": PoolRoom(0, False)}}, Skip.NO_PEER_ROOM),  # another pool's room
        ({"dark": ROOMY}, Skip.NO_PEER_ROOM),  # no ingress to send it to
        ({"eu": ROOMY}, Skip.NO_PEER_ROOM),  # itself
        ({"mars": ROOMY}, Skip.NO_PEER_ROOM),  # not in regions.list
        ({"us": ROOMY, "ap": ROOMY}, Skip.TOO_FAR),
    ],
)
def test_only_a_peer_reporting_room_within_reach_is_chosen(
    peers: Mapping[str, Mapping[str, PoolRoom]], skipped: Skip
) -> None:
    far = Links(us=250, ap=201)  # max_added_ms is 200
    assert choose(peers=peers, links=far if skipped is Skip.TOO_FAR else None) == (None, skipped)


def test_an_unmeasured_link_is_never_crossed() -> None:
    assert choose(links=Links(us=80)) == ("us", None)
    assert choose(links=Links()) == (None, Skip.TOO_FAR)


def test_round_trips_are_an_ewma_forgotten_when_a_probe_fails() -> None:
    links = RoundTrips(weight=0.5)
    assert links.rtt_s("us") is None
    assert links.measured("us", 0.1) == pytest.approx(0.1)
    assert links.measured("us", 0.2) == pytest.approx(0.15)
    links.failed("us")
    assert links.rtt_s("us") is None
    assert links.measured("us", 0.3) == pytest.approx(0.3)  # starts again


def test_crossing_pools_cannot_be_policy_pools() -> None:
    assert crossing_pool("us") == "region:us" and crossed_to("region:us") == "us"
    assert crossed_to("default") is None
    with pytest.raises(PolicyError):
        parse_policy({"pools": {"region:us": {"endpoints": ["127.0.0.1:1"]}}})


# -- through the admission chain ----------------------------------------------------------


def board_at(level: BreakerLevel, clock: VirtualClock) -> BreakerBoard:
    board = BreakerBoard(
        lambda: POLICY, ResponseWindows(clock), lambda pool: None, lambda: None, clock
    )
    board.drill("default", level, duration_s=600)
    return board


def chain(
    level: BreakerLevel,
    peers: Mapping[str, Mapping[str, PoolRoom]],
    skips: Skips,
    new_waiter: Callable[[], Waiter] | None = None,
) -> Any:
    clock = VirtualClock()
    store = InProcessStore(clock)
    crossing = Crossing(Rooms(peers), Links(us=80), skips, routable=["us", "ap"])
    admission = build_admission(
        board=board_at(level, clock),
        store=store,
        events=NoEvents(),
        clock=clock,
        ttl_s=660,
        policy=lambda: POLICY,
        new_waiter=new_waiter,
        crossing=crossing,
    )
    return admission, store


def request(
    tier: Tier, rid: str, tokens_per_minute: int = 100_000, context: int = 2000, **fields: Any
) -> Any:
    limits = Limits(tokens_per_minute=tokens_per_minute)
    return dataclasses.replace(
        decision(context, tier=tier, policy=POLICY, request_id=rid),
        caller=caller(tier, limits=limits),
        **fields,
    )


async def test_at_the_crossing_level_a_sheddable_request_crosses_charged_here() -> None:
    """Instead of the 429 the breaker gives sheddable traffic at L2: re-routed to the peer's
    crossing pool, its budget reserved at the origin, nothing held in the local KV."""
    skips = Skips()
    admission, store = chain(BreakerLevel.L2, {"us": ROOMY}, skips)
    sheddable = request(Tier.SHEDDABLE, "r1")
    admitted = await admission.chain.admit(Applicant(sheddable, "r1", POLICY))
    crossed = admitted.decision
    assert crossed.pool == "region:us" and not crossed.may_cross
    assert crossed.level is BreakerLevel.L2  # its budget scaled as the level it met here
    assert admission.kv.book.holds == 0
    budget = sheddable.caller.budget_id
    assert await store.outstanding(budget) == 1
    # ... and settled at the origin from its access-log entry, as any request.
    await admission.chain.record(outcome(crossed, tracking_id="r1", completion_tokens=5))
    assert await store.outstanding(budget) == 0 and sum((await store.usage(budget)).values())
    # Critical traffic stays (admitted at L2 as the table says), and is counted.
    critical = request(Tier.CRITICAL, "r2")
    stays = await admission.chain.admit(Applicant(critical, "r2", POLICY))
    assert stays.decision.pool == "default" and admission.kv.book.holds == 1
    assert skips.seen == ["not_tolerant"]


async def test_without_a_peer_with_room_the_breaker_sheds_as_before() -> None:
    skips = Skips()
    admission, _ = chain(BreakerLevel.L2, {"us": {"default": PoolRoom(3, False)}}, skips)
    with pytest.raises(Shed):
        await admission.chain.admit(Applicant(request(Tier.SHEDDABLE, "r1"), "r1", POLICY))
    assert skips.seen == ["no_peer_room"]


async def test_a_budget_refusal_never_crosses() -> None:
    admission, _ = chain(BreakerLevel.L2, {"us": ROOMY}, Skips())
    poor = request(Tier.SHEDDABLE, "r1", tokens_per_minute=100)
    with pytest.raises(RateLimited):
        await admission.chain.admit(Applicant(poor, "r1", POLICY))


async def test_a_full_pool_sends_a_tolerant_request_across_instead_of_a_503() -> None:
    """The KV step, without a waiting room: the pool has no room for it."""
    skips = Skips()
    admission, _ = chain(BreakerLevel.L0, {"us": ROOMY}, skips)
    filler = request(Tier.CRITICAL, "fill", context=4_700)  # 8,460 of 10,000 tokens of KV
    await admission.chain.admit(Applicant(filler, "fill", POLICY))
    with pytest.raises(Overloaded):  # critical: refused here, as before
        await admission.chain.admit(Applicant(request(Tier.CRITICAL, "c"), "c", POLICY))
    # Sheddable's share of the pool is smaller: full for it too.
    crossed = await admission.chain.admit(Applicant(request(Tier.SHEDDABLE, "s"), "s", POLICY))
    assert crossed.decision.pool == "region:us"
    assert admission.kv.book.holds == 1  # the filler's alone
    assert skips.seen == ["not_tolerant"]


async def test_a_request_the_waiting_room_would_refuse_crosses_one_that_may_wait_waits() -> None:
    skips = Skips()
    admission, _ = chain(
        BreakerLevel.L0, {"us": ROOMY}, skips, lambda: asyncio.get_running_loop().create_future()
    )
    filler = request(Tier.CRITICAL, "fill", context=4_700)  # 8,460 of 10,000 tokens of KV
    await admission.chain.admit(Applicant(filler, "fill", POLICY))
    waits = asyncio.Event()
    first = asyncio.create_task(
        admission.chain.admit(
            Applicant(request(Tier.SHEDDABLE, "w"), "w", POLICY, lambda s: waits.set())
        )
    )
    await waits.wait()  # it waits: the room had a place
    assert not first.done() and "w" in admission.kv.dispatcher.room
    # The room's one sheddable place is taken: the next would get 503 queue_full.
    crossed = await admission.chain.admit(Applicant(request(Tier.SHEDDABLE, "s"), "s", POLICY))
    assert crossed.decision.pool == "region:us"
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert skips.seen == []


async def test_a_request_crossed_in_is_not_charged_and_never_crosses_again() -> None:
    """At the receiving region: its origin's token verified (crossed_from), the budget and
    spend steps charge nothing; its pool saturated here too, it is shed, not sent on."""
    skips = Skips()
    admission, store = chain(BreakerLevel.L0, {"us": ROOMY}, skips)
    arrived = request(Tier.SHEDDABLE, "r1", tokens_per_minute=100, crossed_from="us")
    arrived = dataclasses.replace(arrived, may_cross=False)
    admitted = await admission.chain.admit(Applicant(arrived, "r1", POLICY))
    assert admitted.decision.pool == "default"  # a budget of 100 would have refused it
    budget = arrived.caller.budget_id
    assert await store.outstanding(budget) == 0
    await admission.chain.record(outcome(admitted.decision, tracking_id="r1"))
    assert sum((await store.usage(budget)).values()) == 0
    saturated, _ = chain(BreakerLevel.L2, {"us": ROOMY}, skips)
    with pytest.raises(Shed):
        await saturated.chain.admit(Applicant(arrived, "r2", POLICY))
    assert skips.seen == ["already_crossed"]


def test_no_region_agent_means_no_peer() -> None:
    assert NoPeers().peers() == {}


async def test_a_request_the_breaker_kept_is_not_asked_about_again_by_the_kv_step() -> None:
    """At L2 the breaker step asked already; the KV step refusing it for room asks nothing
    (the same answer), so a request is counted once."""
    skips = Skips()
    admission, _ = chain(BreakerLevel.L2, {"us": ROOMY}, skips)
    await admission.chain.admit(
        Applicant(request(Tier.CRITICAL, "fill", context=4_700), "fill", POLICY)
    )
    with pytest.raises(Overloaded):
        await admission.chain.admit(Applicant(request(Tier.CRITICAL, "c"), "c", POLICY))
    assert skips.seen == ["not_tolerant", "not_tolerant"]  # the filler's and its own


def test_a_region_named_by_serve_region_never_crosses_to_itself() -> None:
    """One policy file for every region (`slogate serve --region ap`): ap is this region."""
    choice = cross_to(
        regions=POLICY.regions,
        this="ap",
        pool="default",
        tier=Tier.SHEDDABLE,
        tenant="t",
        may_cross=True,
        level=2,
        waiting_full=False,
        peers={"ap": ROOMY, "eu": ROOMY},
        links=Links(ap=10, eu=90),
    )
    assert choice.peer == "eu"


def test_a_peer_envoy_has_no_route_to_is_not_crossed_to() -> None:
    """A region a reload added: Envoy, rendered from the policy the sidecar started with,
    has no route for it (the request would fall to the default pool)."""
    skips = Skips()
    crossing = Crossing(Rooms({"us": ROOMY}), Links(us=80), skips, routable=["ap"])
    applicant = Applicant(request(Tier.SHEDDABLE, "r"), "r", POLICY)
    assert crossing.reroute(applicant, 2, False) is None
    assert skips.seen == ["no_peer_room"]
