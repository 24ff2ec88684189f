"""Regions in the simulator, (d): crossing. One region's pool saturated by sheddable
requests beside critical ones; its tolerant requests go to a peer with room through the
sidecar's own crossing code (admission.crossing re-routing from the breaker and KV steps,
HMAC tokens minted at the origin and verified at the peer), the WAN's delay each way and
the peer's queue: the share that crossed, their added time to first byte, critical kept
local. The regions and their setup: sim.studies.regions_setup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policy.schema import Policy
from sim.fleet.arrivals import Arrival, poisson_arrivals
from sim.fleet.fleet_types import Served
from sim.fleet.offline import OfflineFleet
from sim.fleet.regions import RegionsFleet
from sim.studies.regions_setup import RegionsSetup, region_policy, regions_fleet


@dataclass(frozen=True, slots=True)
class CrossingLoad:
    """(d): the last region's pool saturated (its engine's KV and batch slots, its waiting
    room) by sheddable requests beside critical ones; sheddable requests of the peers' own
    in `own_in` (all peers when empty), as the baseline of their time to first byte."""

    kv_tokens: int = 250_000  # an eighth of the others'
    slots: int = 8
    max_waiting: int = 8  # per pool and tier
    sheddable_per_s: float = 4.0
    critical_per_s: float = 1.0
    own_per_s: float = 1.0
    own_in: tuple[int, ...] = ()
    output_tokens: int | None = None  # None: the setup's
    duration_s: float = 120.0
    warm_s: float = 20.0  # read from then on: the saturated pool has reached L2


def run_crossing(
    setup: RegionsSetup, load: CrossingLoad | None = None
) -> tuple[RegionsFleet, dict[str, Policy]]:
    """(d) played (CrossingLoad)."""
    load = load or CrossingLoad()
    saturated = setup.regions[-1]
    policies = {
        name: region_policy(
            setup, name, crossing=True, max_waiting=load.max_waiting if name == saturated else None
        )
        for name in setup.regions
    }
    fleet, _ = regions_fleet(
        setup,
        policies,
        region_options={
            saturated: {"kv_capacity_tokens": load.kv_tokens, "max_running": load.slots}
        },
    )
    output = load.output_tokens or setup.output_tokens
    arrivals: dict[str, list[Arrival]] = {}
    for index, name in enumerate(setup.regions):
        if name == saturated:
            rates = {"batch": load.sheddable_per_s, "crit": load.critical_per_s}
        elif not load.own_in or index in load.own_in:
            rates = {"batch": load.own_per_s}
        else:
            rates = {}
        arrivals[name] = []
        for number, (tenant, rate) in enumerate(sorted(rates.items())):
            key = policies[name].key_for(f"sk-{tenant}")
            assert key is not None
            arrivals[name] += poisson_arrivals(
                key,
                rate,
                0.0,
                load.duration_s,
                list(setup.prompt_tokens),
                output,
                seed=setup.seed * 1000 + 500 + index * 10 + number,
                output_tokens=[output, output],
            )
        arrivals[name].sort(key=lambda a: a.at_s)
    fleet.run(arrivals, load.duration_s + 60.0 + output * 0.05)
    return fleet, policies


def crossing(
    setup: RegionsSetup, played: RegionsFleet | None = None, load: CrossingLoad | None = None
) -> dict[str, Any]:
    """(d)'s numbers, from the load's warm_s on: the share of the saturated region's
    sheddable requests that crossed and their time to first byte against the peers' own
    sheddable requests' (the added time: the WAN there and back, and the peer's queue);
    its critical requests, all kept local. `played`: run_crossing's fleet (None: play it)."""
    load = load or CrossingLoad()
    fleet = played if played is not None else run_crossing(setup, load)[0]
    saturated = setup.regions[-1]
    results = [
        s for s in fleet.seats[saturated].fleet.results.values() if s.arrival.at_s >= load.warm_s
    ]

    def of(tenant: str) -> list[Served]:
        return [s for s in results if s.arrival.key.tenant == tenant]

    batch, crit = of("batch"), of("crit")
    crossed = [s for s in batch if s.outcome.startswith("crossed")]
    crossed_ttft = [s.ttft_s for s in crossed if s.ttft_s is not None]
    local_ttft = [s.ttft_s for s in batch if s.outcome == "served" and s.ttft_s is not None]
    peer_ttft = [
        s.ttft_s
        for name, seat in fleet.seats.items()
        if name != saturated
        for s in seat.fleet.results.values()
        if s.arrival.at_s >= load.warm_s
        and s.arrival.key.tenant == "batch"
        and ":" not in _request_id(seat.fleet, s)
        and s.outcome == "served"
        and s.ttft_s is not None
    ]
    links = setup.links_s
    peers = [name for name in setup.regions if name != saturated]
    crossed_p50, peer_p50 = _median(crossed_ttft), _median(peer_ttft)
    return {
        "region": saturated,
        "load": dataclasses.asdict(load),
        "sheddable": len(batch),
        "crossed": len(crossed),
        "crossed_share": len(crossed) / len(batch) if batch else None,
        "crossed_failed": sum(1 for s in crossed if s.outcome != "crossed"),
        "sheddable_served_locally": sum(1 for s in batch if s.outcome == "served"),
        "sheddable_refused": sum(
            1 for s in batch if s.outcome not in ("served",) and not s.outcome.startswith("crossed")
        ),
        "critical": len(crit),
        "critical_crossed": sum(1 for s in crit if s.outcome.startswith("crossed")),
        "critical_served_locally": sum(1 for s in crit if s.outcome == "served"),
        "crossed_ttft_p50_s": crossed_p50,
        "local_sheddable_ttft_p50_s": _median(local_ttft),
        "peer_own_ttft_p50_s": peer_p50,
        "added_ttft_p50_s": None
        if crossed_p50 is None or peer_p50 is None
        else crossed_p50 - peer_p50,
        "link_rtt_s": {p: 2 * (links[saturated] + links[p]) for p in peers},
        "crossed_to": {
            f"{peer}/{tier}": count for (peer, tier), count in fleet.crossing.crossed.items()
        },
        "skipped": dict(fleet.crossing.skipped),
        "tokens_rejected": dict(fleet.crossing.rejected),
    }


def _request_id(fleet: OfflineFleet, served: Served) -> str:
    return next(rid for rid, s in fleet.results.items() if s is served)


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
