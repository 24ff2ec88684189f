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

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission.regions import global_tenant
from budget.global_ledger import InProcessGlobalLedger
from budget.lease_holder import LeaseHolder
from budget.leases import Lease, LeaseSettings, Report, TenantReport
from budget.region_demand import RegionDemand
from extproc.runtime.region_agent import new_holder, pool_rooms
from policy.schema import Policy
from sim.fleet.arrivals import Arrival
from sim.fleet.clock import VirtualClock
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
        every region's OfflineFleet."""
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
        for index, (name, policy) in enumerate(policies.items()):
            ledger = policy.regions.ledger
            holder = new_holder(ledger)  # as the region agent makes it
            demand = RegionDemand()
            shares = LeaseShares(holder, self.clock)
            fleet = OfflineFleet(
                policy,
                seed=seed * 10 + index,
                clock=self.clock,
                shares=shares,
                demand=demand,
                **fleet_options,
            )
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
        elif kind == "duplicate":
            # The last report that reached the ledger before the cut, delivered again
            # after the heal (one lost in the cut would be news to the ledger, not a
            # duplicate).
            before = [seq for seq in seat.delivered if seat.sent_s[seq] < payload]
            if before:
                stale = seat.reports[max(before)]
                self.duplicates.append((now_s, run_now(self.ledger.report(stale))))

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
