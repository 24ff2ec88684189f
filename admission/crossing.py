"""Crossing regions: whether a request its own region has no room for goes to a peer
region instead, and to which one. Pure: what the peers report, the measured round trips
and the clock-free policy come in; a region name (or why not) goes out.

What lives here: `cross_to` (the rule), `Crossing` (the rule as the admission steps ask
it: it re-routes the decision to the peer's crossing pool, `region:<peer>`), `RoundTrips`
(each peer's measured round trip, an EWMA), `LinkTimes` (what it reads of them), `NoPeers`
and the events it reports. The peers' room is admission.regions.PeerRooms (the region
agent answers it from the latest lease).

The rule (docs/contributors/regions.md, "Crossing"):
- only when the request's own pool is saturated: its breaker level is at
  `crossing.from_level` or above (the breaker step asks), or the pool has no room and its
  waiting room would refuse the request (the KV step asks, where it would answer 503
  `queue_full` / `kv_cache_full` / `sequences_full`). A request that may wait its turn
  waits: a wait in the room is no refusal. Budget refusals never cross: the tenant's
  budget is the same wherever the request runs;
- only a tolerant request: its tenant is listed in `crossing.tenants`, or its tier in
  `crossing.tiers` — but never the critical tier by its tier alone (the policy refuses
  `critical` there): critical traffic is the latency-sensitive kind the issue keeps local,
  unless its tenant was listed by name;
- only to a peer that reported, freshly (the region agent's `peers()` is empty once the
  lease it came with is stale), a pool of the same name below `from_level` whose waiting
  room is not full, and whose measured round trip is within `max_added_ms`; an
  unmeasured link (no probe answered yet, or the last one failed) is never crossed to;
- the lowest round trip wins (ties: the name);
- a request that arrived crossed (verified or not) never crosses again.

Crossing is a re-route, like the breaker's L3 re-route to the fallback pool: the decision's
pool becomes `region:<peer>`, which no policy pool can be named (pool names are
[a-z0-9_-]): the KV step holds nothing for it, the picker picks nothing, the budget and
spend steps reserve as for any request (the origin charges it and settles it from its own
access log), and Envoy's route for that metadata value goes to the peer's ingress.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from admission.decision import Applicant, RoutingDecision
from admission.regions import PeerRooms
from budget.leases import PoolRoom
from policy._regions import CrossingConfig, RegionsConfig
from policy.domain import Tier

CROSSING_POOL_PREFIX = "region:"
# How much of each new round trip the estimate takes: a few probes to follow a link that
# changed, one slow answer does not move it much.
RTT_WEIGHT = 0.3


def crossing_pool(region: str) -> str:
    """The pool (metadata value, Envoy route and cluster) of requests crossing to `region`."""
    return f"{CROSSING_POOL_PREFIX}{region}"


def crossed_to(pool: str) -> str | None:
    """The peer region a decision's pool sends it to; None: a pool of this region."""
    return pool[len(CROSSING_POOL_PREFIX) :] if pool.startswith(CROSSING_POOL_PREFIX) else None


class NoPeers:
    """No peer reported anything (no region agent): nothing crosses."""

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        return {}


class LinkTimes(Protocol):
    def rtt_s(self, peer: str) -> float | None:
        """The measured round trip to `peer`'s ingress; None: not measured, or it failed."""
        ...


class CrossingEvents(Protocol):
    def crossing_skipped(self, reason: str) -> None:
        """A saturated pool's request did not cross (`Skip`)."""
        ...


class Skip(StrEnum):
    ALREADY_CROSSED = "already_crossed"
    NOT_TOLERANT = "not_tolerant"
    NO_PEER_ROOM = "no_peer_room"  # no fresh peer reported room in this pool
    TOO_FAR = "too_far"  # peers with room, none measured within max_added_ms


@dataclass(frozen=True, slots=True)
class Choice:
    peer: str | None = None
    skipped: Skip | None = None  # None with no peer: the pool was not saturated


def tolerant(config: CrossingConfig, tier: Tier, tenant: str) -> bool:
    """Whether a request may be sent further away: its tenant is listed, or its tier is
    (the critical tier never by its tier alone)."""
    return tenant in config.tenants or (tier is not Tier.CRITICAL and tier in config.tiers)


def cross_to(
    *,
    regions: RegionsConfig,
    this: str | None,
    pool: str,
    tier: Tier,
    tenant: str,
    may_cross: bool,
    level: int,
    waiting_full: bool,
    peers: Mapping[str, Mapping[str, PoolRoom]],
    links: LinkTimes,
) -> Choice:
    """Where a request of `pool` goes when its pool is at breaker `level` (and its waiting
    room would refuse it: `waiting_full`): a peer region, or why not. `this`: the region
    deciding (`slogate serve --region`, else the policy's `regions.this`)."""
    config = regions.crossing
    if not regions.enabled or not config.enabled:
        return Choice()
    if level < config.from_level and not waiting_full:
        return Choice()
    if not may_cross:
        return Choice(skipped=Skip.ALREADY_CROSSED)
    if not tolerant(config, tier, tenant):
        return Choice(skipped=Skip.NOT_TOLERANT)
    with_room = []
    for name, rooms in peers.items():
        region = regions.regions.get(name)
        room = rooms.get(pool)
        if name == this or region is None or region.ingress is None or room is None:
            continue
        if room.level < config.from_level and not room.waiting_full:
            with_room.append(name)
    if not with_room:
        return Choice(skipped=Skip.NO_PEER_ROOM)
    limit_s = config.max_added_ms / 1000
    near = []
    for name in with_room:
        rtt_s = links.rtt_s(name)
        if rtt_s is not None and rtt_s <= limit_s:
            near.append((rtt_s, name))
    if not near:
        return Choice(skipped=Skip.TOO_FAR)
    return Choice(peer=min(near)[1])


class Crossing:
    """The rule as the admission steps ask it, with what it reads wired in."""

    def __init__(
        self,
        rooms: PeerRooms,
        links: LinkTimes,
        events: CrossingEvents,
        this: str | None = None,
        routable: Collection[str] = (),
    ) -> None:
        """`this`: `slogate serve --region` (None: the policy's `regions.this`);
        `routable`: the peers Envoy has a route to (those with an ingress in the policy it
        was rendered from, the one the sidecar started with): a peer a reload added is not
        crossed to until both restart."""
        self._this = this
        self._routable = frozenset(routable)
        self._rooms = rooms
        self._links = links
        self._events = events

    def reroute(
        self, applicant: Applicant, level: int, waiting_full: bool
    ) -> RoutingDecision | None:
        """The decision re-routed to a peer's crossing pool, or None (it stays)."""
        regions = applicant.policy.regions
        if not regions.crossing.enabled:
            return None
        decision = applicant.decision
        choice = cross_to(
            regions=regions,
            this=self._this or regions.this,
            pool=decision.pool,
            tier=decision.caller.tier,
            tenant=decision.caller.tenant,
            may_cross=decision.may_cross,
            level=level,
            waiting_full=waiting_full,
            peers={p: r for p, r in self._rooms.peers().items() if p in self._routable},
            links=self._links,
        )
        if choice.skipped is not None:
            self._events.crossing_skipped(choice.skipped.value)
        if choice.peer is None:
            return None
        return dataclasses.replace(decision, pool=crossing_pool(choice.peer), may_cross=False)


class RoundTrips:
    """Each peer's round trip: an exponentially weighted average of the probes' (the first
    answer taken as it is); a failed probe forgets it, so an unreachable peer (a partition:
    TCP hangs until the probe's timeout) is not crossed to until it answers again."""

    def __init__(self, weight: float = RTT_WEIGHT) -> None:
        self._weight = weight
        self._rtt_s: dict[str, float] = {}

    def measured(self, peer: str, rtt_s: float) -> float:
        last = self._rtt_s.get(peer)
        value = rtt_s if last is None else last + self._weight * (rtt_s - last)
        self._rtt_s[peer] = value
        return value

    def failed(self, peer: str) -> None:
        self._rtt_s.pop(peer, None)

    def rtt_s(self, peer: str) -> float | None:
        return self._rtt_s.get(peer)
