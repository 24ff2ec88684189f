"""Regions on one virtual clock: each a fleet with its own sidecar and budget store, one
global ledger reached over a link with a one-way delay.

What lives here: `RegionsFleet`, which plays each region's arrivals through its own
`OfflineFleet` (the sidecar's admission chain with the region's `LeaseShares` and
`RegionDemand`, as the region agent wires them; its own in-process budget store) and,
every `report_interval_s`, sends the region's report to one `InProcessGlobalLedger`
(budget.leases' `apply_report`, what the Lua script on the global Redis does): the report
arrives `delay_s` later, its lease comes back `delay_s` after that and goes into the
region's `LeaseHolder` (budget.lease_holder), whose share of each global tenant scales
the tenant's limits in the region's budget step. A `Cut` loses every report and lease on
a region's link for a while (a partition); a region that dies stops reporting. What the
runs measure is sim.studies.regions'; the design is docs/contributors/regions.md.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from admission.crossing import Crossing
from admission.regions import global_tenant
from budget.global_ledger import InProcessGlobalLedger
from budget.lease_holder import LeaseHolder
from budget.leases import Lease, LeaseSettings, PoolRoom, Report, TenantReport
from budget.region_demand import RegionDemand
from extproc.request.crossing_token import CrossingDesk
from extproc.runtime.region_agent import new_holder, pool_rooms
from policy.schema import Policy
from sim.fleet.arrivals import Arrival
from sim.fleet.clock import VirtualClock
from sim.fleet.fleet_types import Served
from sim.fleet.offline import OfflineFleet
from sim.fleet.sidecar import run_now


@dataclass(frozen=True, slots=True)
class Cut:
    """A region's link to the global ledger down from `at_s` to `until_s`: what is sent or
    arrives meanwhile is lost, as on a cut TCP connection."""

    region: str
    at_s: float
    until_s: float

    def holds(self, region: str, now_s: float) -> bool:
        return region == self.region and self.at_s <= now_s < self.until_s


@dataclass(frozen=True, slots=True)
class RegionSample:
    """One region's lease as its holder sees it at one moment."""

    at_s: float
    region: str
    state: str  # LeaseHolder.state: leased, cut_off, fallback, closed, none
    # The followed tenant's share (RegionsFleet.tenant), as the budget step enforces it.
    share: float | None


@dataclass(frozen=True, slots=True)
class LeaseSent:
    """A lease the global ledger answered a report with (whether it reached the region or
    not): when, to whom, for which report."""

    at_s: float
    region: str
    report_sent_s: float
    lease: Lease


class LeaseShares:
    """This region's share of each global tenant now, from its lease holder on the virtual
    clock: the admission.regions.RegionShares its sidecars' budget steps read, answering
    as the region agent does (extproc.runtime.region_agent.RegionAgent.share /
    spend_limit): 0 before a lease names the tenant."""

    def __init__(self, holder: LeaseHolder, clock: Callable[[], float]) -> None:
        self._holder = holder
        self._clock = clock

    def share(self, tenant: str) -> float | None:
        return self._holder.share(tenant, self._clock()) or 0.0

    def spend_limit(self, tenant: str, window_id: str, limit: float) -> float | None:
        # The simulated sidecars run no spend step (sim.fleet.sidecar): nothing is spent.
        return self._holder.spend_allowance(tenant, window_id, limit, 0.0, self._clock())

    async def first_lease(self, tenant: str, wait_s: float) -> None:
        # The live sidecar waits for the region's next lease in real time; the simulated
        # request does not (the fleet's clock is virtual): a tenant's first request in a
        # region is refused here where live it might have waited for its first lease.
        return None


# The regions' shared crossing secret (the HMAC key of the tokens; at least 32 bytes).
CROSSING_SECRET = b"the simulated regions' shared key"


class CrossingTally:
    """What the crossing code reports (admission.crossing's events, the desk's counts),
    counted: requests sent to each peer by tier, skips by reason, tokens rejected."""

    def __init__(self) -> None:
        self.crossed: Counter[tuple[str, str]] = Counter()
        self.skipped: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()

    def crossed_to(self, peer: str, tier: str) -> None:
        self.crossed[(peer, tier)] += 1

    def crossing_skipped(self, reason: str) -> None:
        self.skipped[reason] += 1

    def token_rejected(self, reason: str) -> None:
        self.rejected[reason] += 1


class _DeskCounts:
    """The desk's CrossingCounts onto a tally (its `crossed` is the tally's `crossed_to`)."""

    def __init__(self, tally: CrossingTally) -> None:
        self._tally = tally

    def crossed(self, peer: str, tier: str) -> None:
        self._tally.crossed_to(peer, tier)

    def token_rejected(self, reason: str) -> None:
        self._tally.token_rejected(reason)


class WanLinks:
    """The round trip from one region to another's ingress: through the WAN's hub, each
    link's one-way delay there and back (as the lab's relays route it); what the peer
    probe measures, here known exactly."""

    def __init__(self, this: str, delays_s: Mapping[str, float]) -> None:
        self._this = this
        self._delays_s = delays_s

    def one_way_s(self, peer: str) -> float:
        return self._delays_s[self._this] + self._delays_s[peer]

    def rtt_s(self, peer: str) -> float | None:
        return 2 * self.one_way_s(peer) if peer in self._delays_s else None


@dataclass(slots=True)
class RegionSeat:
    """One region: its fleet, its lease holder and what it has sent and heard."""

    name: str
    fleet: OfflineFleet
    holder: LeaseHolder
    shares: LeaseShares  # what its sidecars' budget steps enforce
    demand: RegionDemand  # what its sidecars' budget steps counted since the last report
    global_tenants: frozenset[str]
    usage: dict[str, float] = field(default_factory=dict)  # tenant -> settled, cumulative
    seq: int = 0
    sent_s: dict[int, float] = field(default_factory=dict)  # report seq -> when it left
    answered: dict[int, float] = field(default_factory=dict)  # seq -> when its lease came
    reports: dict[int, Report] = field(default_factory=dict)  # seq -> what it sent
    in_flight: int | None = None  # the report awaiting its answer (one at a time)
    delivered: set[int] = field(default_factory=set)  # the reports that reached the ledger
    dead_at_s: float = math.inf
    lease: Lease | None = None  # the latest lease received

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        """The peers' pools' room from the latest lease, empty once it is stale: what the
        region agent answers (RegionAgent.peers), admission.regions.PeerRooms."""
        now_s = self.fleet.clock.now_s
        if self.lease is None or self.holder.state(now_s) not in ("leased", "cut_off"):
            return {}
        return self.lease.peers


class RegionsFleet:
    def __init__(
        self,
        policies: Mapping[str, Policy],
        delay_s: float | Mapping[str, float],
        tenant: str,
        seed: int = 0,
        cuts: Sequence[Cut] = (),
        deaths: Mapping[str, float] | None = None,
        sample_s: float = 0.1,
        late_duplicates: bool = True,
        region_options: Mapping[str, Mapping[str, Any]] | None = None,
        **fleet_options: Any,
    ) -> None:
        """`policies`: each region's policy (its `regions.this` naming it; the same ledger
        settings in all); `delay_s`: the link's one-way delay to the global ledger (or
        each region's);
        `tenant`: the global tenant whose share is sampled every `sample_s`; `cuts`: the
        partitions; `deaths`: region -> when it stops (no more reports; its arrivals are
        the caller's to stop); `late_duplicates`: when a cut heals, the last report sent
        before it reaches the ledger once more after the region's first new one (a
        retried request arriving late), which must change nothing; `fleet_options`: for
        every region's OfflineFleet, `region_options`: for one region's (over those).
        With `regions.crossing` enabled each region's sidecars send saturated pools'
        tolerant requests to a peer (admission.crossing, with the real tokens), which
        reach it one WAN link later (`WanLinks`) and answer back as late again."""
        first = next(iter(policies.values()))
        self.settings = LeaseSettings.of(first.regions.ledger)
        self.interval_s = first.regions.ledger.report_interval_s
        self.timeout_s = first.regions.ledger.timeout_ms / 1000.0
        self.delays_s = {
            name: delay_s if isinstance(delay_s, float | int) else delay_s[name]
            for name in policies
        }
        self.tenant = tenant
        self.clock = VirtualClock()
        self.ledger = InProcessGlobalLedger(self.settings, self.clock)
        self.cuts = tuple(cuts)
        self.late_duplicates = late_duplicates
        self.sample_s = sample_s
        self.seats: dict[str, RegionSeat] = {}
        self.crossing = CrossingTally()
        self._crossed: dict[str, tuple[str, str]] = {}  # id at the peer -> (origin, its id)
        for index, (name, policy) in enumerate(policies.items()):
            ledger = policy.regions.ledger
            holder = new_holder(ledger)  # as the region agent makes it
            demand = RegionDemand()
            shares = LeaseShares(holder, self.clock)
            links = WanLinks(name, self.delays_s)
            crossing = desk = None
            if policy.regions.crossing.enabled:
                routable = [p.name for p in policy.regions.peers(name) if p.ingress is not None]
                rooms = _SeatRooms(self, name)
                crossing = Crossing(rooms, links, self.crossing, name, routable)
                desk = CrossingDesk(CROSSING_SECRET, self.clock, _DeskCounts(self.crossing), name)
            options = {**fleet_options, **(region_options or {}).get(name, {})}
            fleet = OfflineFleet(
                policy,
                seed=seed * 10 + index,
                clock=self.clock,
                shares=shares,
                demand=demand,
                crossing=crossing,
                desk=desk,
                **options,
            )
            fleet.cross_out = partial(self._cross_out, name)
            tenants = frozenset(
                key.tenant for key in policy.keys.values() if global_tenant(policy, key.tenant)
            )
            seat = RegionSeat(name, fleet, holder, shares, demand, tenants)
            seat.dead_at_s = (deaths or {}).get(name, math.inf)
            self.seats[name] = seat
        self.samples: list[RegionSample] = []
        self.leases: list[LeaseSent] = []
        self.duplicates: list[tuple[float, Lease]] = []  # (when, the ledger's answer to one)
        self._events: list[tuple[float, int, str, str, Any]] = []
        self._sequence = itertools.count()

    def _push(self, at_s: float, kind: str, region: str, payload: Any = None) -> None:
        heapq.heappush(self._events, (at_s, next(self._sequence), kind, region, payload))

    def _cut(self, region: str, now_s: float) -> bool:
        return any(cut.holds(region, now_s) for cut in self.cuts)

    def run(self, arrivals: Mapping[str, Sequence[Arrival]], until_s: float) -> None:
        """Play every region's arrivals and the link until `until_s`; reports go on to the
        end, so the last ones carry every request's settled usage."""
        names = list(self.seats)
        for index, (name, seat) in enumerate(self.seats.items()):
            seat.fleet.begin(arrivals.get(name, ()), until_s)
            # Each region's holder reports on its own phase, as separate processes do.
            offset_s = self.interval_s * (index + 1) / (len(names) + 1)
            for tick in range(math.ceil((until_s - offset_s) / self.interval_s)):
                self._push(offset_s + tick * self.interval_s, "report", name)
        for tick in range(math.ceil(until_s / self.sample_s) + 1):
            self._push(tick * self.sample_s, "sample", "")
        if self.late_duplicates:
            for cut in self.cuts:
                at_s = cut.until_s + 2 * self.delays_s[cut.region]
                self._push(at_s, "duplicate", cut.region, cut.at_s)
        fleets = [seat.fleet for seat in self.seats.values()]
        while True:
            fleet_at = [f.next_event_s() for f in fleets]
            soonest = min((at for at in fleet_at if at is not None), default=math.inf)
            link_at = self._events[0][0] if self._events else math.inf
            if soonest == math.inf and link_at == math.inf:
                return
            if link_at <= soonest:
                at_s, _, kind, region, payload = heapq.heappop(self._events)
                self.clock.now_s = at_s
                self._link(kind, region, payload)
            else:
                fleets[fleet_at.index(soonest)].step()

    def _link(self, kind: str, region: str, payload: Any) -> None:
        now_s = self.clock.now_s
        if kind == "sample":
            for seat in self.seats.values():
                state = seat.holder.state(now_s)
                share = seat.shares.share(self.tenant)
                self.samples.append(RegionSample(now_s, seat.name, state, share))
            return
        seat = self.seats[region]
        if kind == "cross_in":
            self._cross_in(region, *payload)
            return
        if kind == "cross_back":
            seat.fleet.answered_by_peer(*payload)
            return
        if now_s >= seat.dead_at_s:
            return  # a dead region sends nothing and hears nothing
        if kind == "report":
            self._send(seat, now_s)
        elif kind == "timeout":
            self._timed_out(seat, now_s)
        elif kind == "at_ledger":
            if not self._cut(region, now_s):
                seat.delivered.add(payload.seq)
                lease = run_now(self.ledger.report(payload))
                self.leases.append(LeaseSent(now_s, region, seat.sent_s[payload.seq], lease))
                self._push(now_s + self.delays_s[region], "lease", region, lease)
        elif kind == "lease":
            if not self._cut(region, now_s) and seat.in_flight == payload.seq:
                seat.in_flight = None
                seat.answered[payload.seq] = now_s
                seat.holder.received(payload)
                seat.lease = payload
        elif kind == "duplicate":
            # The last report that reached the ledger before the cut, delivered again
            # after the heal (one lost in the cut would be news to the ledger, not a
            # duplicate).
            before = [seq for seq in seat.delivered if seat.sent_s[seq] < payload]
            if before:
                stale = seat.reports[max(before)]
                self.duplicates.append((now_s, run_now(self.ledger.report(stale))))

    def _cross_out(
        self, origin: str, request_id: str, peer: str, headers: Mapping[str, str]
    ) -> None:
        """A request `origin` re-routed to `peer`: it reaches the peer one WAN link later."""
        one_way_s = WanLinks(origin, self.delays_s).one_way_s(peer)
        self._push(self.clock.now_s + one_way_s, "cross_in", peer, (origin, request_id, headers))

    def _cross_in(
        self, peer: str, origin: str, request_id: str, headers: Mapping[str, str]
    ) -> None:
        sent = self.seats[origin].fleet.results[request_id].arrival
        arrival = dataclasses.replace(sent, at_s=self.clock.now_s)
        here = f"{origin}:{request_id}"
        self._crossed[here] = (origin, request_id)
        on_end = partial(self._answered, peer, here)
        self.seats[peer].fleet.arrive_from_peer(here, arrival, headers, on_end)

    def _answered(self, peer: str, here: str, served: Served, status: int) -> None:
        """A crossed request ended at `peer`: its answer reaches its origin one link later
        (its first token too, one link after the peer sent it)."""
        origin, request_id = self._crossed[here]
        one_way_s = WanLinks(origin, self.delays_s).one_way_s(peer)
        first_s = None
        if served.ttft_s is not None:
            first_s = served.arrival.at_s + served.ttft_s + one_way_s
        payload = (request_id, served, status, first_s)
        self._push(self.clock.now_s + one_way_s, "cross_back", origin, payload)

    def _timed_out(self, seat: RegionSeat, now_s: float) -> None:
        """The report in flight has had its `timeout_ms`: failed (its answer, if it
        comes later, is dropped)."""
        if seat.in_flight is None or now_s < seat.sent_s[seat.in_flight] + self.timeout_s:
            return
        seat.in_flight = None
        seat.holder.failed(now_s)

    def _send(self, seat: RegionSeat, now_s: float) -> None:
        """The region's report leaves, unless one is still in flight (the holder sends one
        at a time: this tick is skipped)."""
        self._timed_out(seat, now_s)
        if seat.in_flight is not None:
            return
        # The region's store adds every flush to its cumulative usage (region_store).
        flushed = seat.demand.take()
        for tenant, part in flushed.items():
            seat.usage[tenant] = seat.usage.get(tenant, 0.0) + part.usage
        tenants = sorted(set(flushed) | set(seat.usage) | seat.global_tenants)
        seat.seq = max(seat.seq, seat.holder.seq) + 1
        report = Report(
            region=seat.name,
            seq=seat.seq,
            tenants=tuple(
                TenantReport(
                    tenant=tenant,
                    demand=flushed[tenant].demand if tenant in flushed else 0.0,
                    usage=seat.usage.get(tenant, 0.0),
                    spend={},
                    applied=seat.holder.applied(tenant, now_s),
                )
                for tenant in tenants
            ),
            pools=pool_rooms(
                seat.fleet.policy,
                seat.fleet.board,
                seat.fleet.sidecars[0].admission.kv.dispatcher.room,
            ),
        )
        seat.reports[report.seq] = report
        seat.sent_s[report.seq] = now_s
        seat.in_flight = report.seq
        seat.holder.sent(now_s)
        self._push(now_s + self.timeout_s, "timeout", seat.name, report.seq)
        if not self._cut(seat.name, now_s):
            self._push(now_s + self.delays_s[seat.name], "at_ledger", seat.name, report)


class _SeatRooms:
    """A region's PeerRooms: its seat's latest lease (the seat is made after its fleet)."""

    def __init__(self, fleet: RegionsFleet, region: str) -> None:
        self._fleet = fleet
        self._region = region

    def peers(self) -> Mapping[str, Mapping[str, PoolRoom]]:
        return self._fleet.seats[self._region].peers()
