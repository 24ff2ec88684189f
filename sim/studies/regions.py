"""Regions in the simulator: the lab's phases (`slogate bench regions`) on the virtual clock.

What lives here: `RegionsSetup` (the regions, the link, the lease settings, the tenant and
its traffic), `play` (one run of the phases: (a) one global tenant spending from every
region at once at twice its global limit, (b) the tenant moving to one region, (c) one
region cut off from the global ledger for about twice lease_s and healed), `death` (a
region dying while the others spend), `sweep` (the link delays and report intervals) and
`table`. The regions are sim.fleet.regions': each a fleet running the sidecar's admission
chain with its own budget store, one in-process global ledger (budget.leases'
apply_report), each region's lease holder (budget.lease_holder) over a link with a delay.

What is measured, as the lab measures it:
- (a) the fleet's admitted weighted tokens in every minute (and every 10 s) from the
  second minute on, over the global limit: the global overshoot (the first minute starts
  with full buckets: one bucket at the global limit admits twice its limit there too);
- (b) seconds from the move until the region admits at least 90% of the global limit (its
  enforced share reaching 0.9; and the first 5 s of admissions at that rate);
- (c) what the cut-off region admitted while cut off, against the share it held, how long
  it served on its lease, then on its fallback, how soon after the heal it held a lease
  again, and reconciliation: the global ledger's usage for the tenant against the sum of
  the regions' settled usage, after a late duplicate of a report from before the cut;
- death: what the other regions lose (the dead region's share they cannot take) and when
  they get it back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from budget.leases import MOVE_REPORTS
from policy._regions import LedgerConfig
from policy.loader import parse_policy
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, poisson_arrivals
from sim.fleet.fleet_types import Served
from sim.fleet.offline import OfflineFleet
from sim.fleet.regions import Cut, RegionsFleet
from sim.fleet.workload_files import SIMULATION_POLICY

TENANT = "acme"
DELAYS_S = (0.04, 0.08, 0.15)  # one way, as the lab's relay delays the WAN
INTERVALS_S = (0.5, 1.0, 2.0)
RAMP_TARGET = 0.9  # (b): the moved tenant's region at 90% of the global limit
CROSSING_TENANTS = {"batch": "sheddable", "crit": "critical"}  # (d)


_NAMES = ("eu", "us", "ap", "sa", "af", "me")


def region_names(count: int) -> tuple[str, ...]:
    """`count` region names: eu, us, ap, ... then r7, r8, ..."""
    return tuple(_NAMES[i] if i < len(_NAMES) else f"r{i + 1}" for i in range(count))


@dataclass(frozen=True, slots=True)
class RegionsSetup:
    regions: tuple[str, ...] = ("eu", "us", "ap")
    delay_s: float = 0.08  # the link's one-way delay to the global ledger
    # Each region's own one-way delay instead (the lab's: eu 20, us 40, ap 75 ms).
    delays_s: tuple[float, ...] | None = None
    cut_index: int = -1  # (c): the region cut off
    interval_s: float = 1.0  # report_interval_s
    lease_s: float = 10.0
    fallback_for_s: float = LedgerConfig().fallback_for_s  # the policy's default
    # Every region's floor; with three regions a region alone can hold 1 - 2 x 0.02 = 0.96
    # (at the policy's default 0.05 it would be 0.90, exactly (b)'s target).
    min_share: float = 0.02
    limit_tpm: int = 600_000  # the tenant's global tokens per minute
    demand_x: float = 2.0  # the tenant asks this many times its limit
    prompt_tokens: tuple[int, int] = (900, 1100)
    output_tokens: int = 100  # each request generates its max_tokens: reserved = settled
    spread_s: float = 150.0  # (a): from every region
    moved_s: float = 90.0  # (b): from the first region only
    rejoined_s: float = 60.0  # (c): from every region again before the cut
    after_heal_s: float = 60.0  # (c): after the heal
    tail_s: float = 30.0  # no arrivals: the last requests settle and are reported
    seed: int = 7

    @property
    def links_s(self) -> dict[str, float]:
        """Each region's one-way delay."""
        if self.delays_s is None:
            return dict.fromkeys(self.regions, self.delay_s)
        return dict(zip(self.regions, self.delays_s, strict=True))

    @property
    def cut_region(self) -> str:
        return self.regions[self.cut_index]

    @property
    def cut_s(self) -> float:
        return 2 * self.lease_s

    @property
    def move_at_s(self) -> float:
        return self.spread_s

    @property
    def cut_at_s(self) -> float:
        return self.spread_s + self.moved_s + self.rejoined_s

    @property
    def heal_at_s(self) -> float:
        return self.cut_at_s + self.cut_s

    @property
    def arrivals_end_s(self) -> float:
        return self.heal_at_s + self.after_heal_s


def lab_setup(seed: int = 7) -> RegionsSetup:
    """The live lab's setup (`slogate bench regions`: tooling.benchmarks.regions'
    RegionsBenchConfig and scenario, whose numbers are copied here: the simulator does not
    import the tools): eu, us, ap at 20 / 40 / 75 ms one way from the global ledger, a
    limit of 120,000 tokens a minute asked twice over in ~2,020-token requests, reports
    every 0.5 s, lease_s 4, fallback_for_s 30, min_share 0.02; (a) 45 s after the buckets
    are drained, (b) 25 s at eu, (c) us cut off for 2 x lease_s right after, healed 3 s."""
    return RegionsSetup(
        delays_s=(0.02, 0.04, 0.075),
        limit_tpm=120_000,
        prompt_tokens=(15, 25),
        output_tokens=2000,
        interval_s=0.5,
        lease_s=4.0,
        fallback_for_s=30.0,
        min_share=0.02,
        spread_s=60.0 + 45.0,
        moved_s=25.0,
        rejoined_s=0.0,
        after_heal_s=3.0,
        tail_s=200.0,  # 2,000 output tokens take the simulated engine a while
        cut_index=1,
        seed=seed,
    )


def _delay_text(setup: RegionsSetup) -> str:
    return "/".join(f"{round(d * 1000)}" for d in dict.fromkeys(setup.links_s.values()))


def region_policy(
    setup: RegionsSetup, this: str, crossing: bool = False, max_waiting: int | None = None
) -> Policy:
    """The policy of region `this`: the simulator's breaker timings, the regions and their
    ledger, one global tenant with its tokens-per-minute limit and one key; `crossing`:
    crossing on for sheddable requests (from L2 or a full waiting room, peers within
    400 ms as the lab sets it), every region with an ingress, and two more tenants of this
    region's own: batch (sheddable) and crit (critical); `max_waiting`: its waiting room
    per pool and tier (None: the policy's default)."""
    document: dict[str, Any] = dict(SIMULATION_POLICY)
    document["regions"] = {
        "this": this,
        "list": {name: {} for name in setup.regions},
        "ledger": {
            "url": "redis://global-ledger:6379/0",  # not reached: the ledger is in-process
            "report_interval_s": setup.interval_s,
            "lease_s": setup.lease_s,
            "fallback_for_s": setup.fallback_for_s,
            "min_share": setup.min_share,
        },
    }
    document["tenants"] = {
        "list": {
            TENANT: {
                "scope": "global",
                "tier": "standard",
                "limits": {"tokens_per_minute": setup.limit_tpm},
            }
        }
    }
    document["keys"] = [{"key": f"sk-{TENANT}", "tenant": TENANT, "tier": "standard"}]
    if crossing:
        document["regions"]["list"] = {
            name: {"ingress": f"10.0.{index}.10:10000"} for index, name in enumerate(setup.regions)
        }
        document["regions"]["crossing"] = {
            "enabled": True,
            "tiers": ["sheddable"],
            "max_added_ms": 400,
            "secret_file": "/run/slogate/regions.key",  # never read: the simulator's own
        }
        if max_waiting is not None:
            document["waiting_room"] = {"max_waiting": max_waiting}
        for tenant, tier in CROSSING_TENANTS.items():
            document["tenants"]["list"][tenant] = {"tier": tier}
            document["keys"].append({"key": f"sk-{tenant}", "tenant": tenant, "tier": tier})
    return parse_policy(document, source=f"regions study ({this})")


def _stream(
    setup: RegionsSetup, policy: Policy, start_s: float, end_s: float, share: float, seed: int
) -> list[Arrival]:
    """The tenant's requests in one region from `start_s` to `end_s`: `share` of its whole
    demand (demand_x times its limit)."""
    key = policy.key_for(f"sk-{TENANT}")
    assert key is not None
    per_request = sum(setup.prompt_tokens) / 2 + setup.output_tokens
    rate = setup.demand_x * setup.limit_tpm / 60.0 / per_request * share
    return poisson_arrivals(
        key,
        rate,
        start_s,
        end_s,
        list(setup.prompt_tokens),
        setup.output_tokens,
        seed=seed,
        output_tokens=[setup.output_tokens, setup.output_tokens],
    )


def _fleet(setup: RegionsSetup, **options: Any) -> tuple[RegionsFleet, dict[str, Policy]]:
    policies = {name: region_policy(setup, name) for name in setup.regions}
    fleet = RegionsFleet(
        policies,
        setup.links_s,
        TENANT,
        seed=setup.seed,
        # Engines with room to spare: the budget, not the KV cache, is what binds here.
        kv_capacity_tokens=2_000_000,
        max_running=512,
        **options,
    )
    return fleet, policies


def _admitted(fleet: RegionsFleet, policy: Policy) -> dict[str, list[tuple[float, float]]]:
    """Per region, each request the budget admitted that ran: (when, weighted tokens)."""
    return {name: _admitted_of(seat.fleet, policy) for name, seat in fleet.seats.items()}


def _admitted_of(fleet: OfflineFleet, policy: Policy) -> list[tuple[float, float]]:
    """What the region's engines ran, by the served requests themselves (not by the
    budget's counts): (arrival, its prompt and output tokens at its bucket's weight)."""

    def tokens(served: Served) -> float:
        raw = served.arrival.prompt_tokens + served.output_tokens
        return raw * policy.bucket_for(raw).cost_weight

    ran = [s for s in fleet.results.values() if s.outcome == "served"]
    return sorted((s.arrival.at_s, tokens(s)) for s in ran)


def _window_max(
    points: Sequence[tuple[float, float]], start_s: float, end_s: float, width_s: float
) -> float:
    """The most admitted in any `width_s` window starting each 0.1 s in [start_s, end_s -
    width_s]; a span shorter than `width_s` is one window, scaled to `width_s` (the lab's
    45 s of phase (a) read per minute)."""
    span_s = min(width_s, end_s - start_s)
    best = 0.0
    steps = round((end_s - span_s - start_s) / 0.1)
    for step in range(steps + 1):
        lo = start_s + step * 0.1
        best = max(best, _sum_between(points, lo, lo + span_s))
    return best * width_s / span_s


def _sum_between(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(tokens for at_s, tokens in points if lo <= at_s < hi)


def run_phases(setup: RegionsSetup) -> tuple[RegionsFleet, dict[str, Policy]]:
    """Phases (a), (b) and (c) played in one run (see the module's note)."""
    fleet, policies = _fleet(setup, cuts=(Cut(setup.cut_region, setup.cut_at_s, setup.heal_at_s),))
    first = setup.regions[0]
    arrivals: dict[str, list[Arrival]] = {}
    even = 1.0 / len(setup.regions)
    for index, name in enumerate(setup.regions):
        policy = policies[name]
        seed = setup.seed * 1000 + index * 10
        arrivals[name] = _stream(setup, policy, 0.0, setup.move_at_s, even, seed)
        if name == first:
            arrivals[name] += _stream(
                setup, policy, setup.move_at_s, setup.move_at_s + setup.moved_s, 1.0, seed + 1
            )
        rejoin_s = setup.move_at_s + setup.moved_s
        arrivals[name] += _stream(setup, policy, rejoin_s, setup.arrivals_end_s, even, seed + 2)
    until_s = setup.arrivals_end_s + setup.tail_s
    fleet.run(arrivals, until_s)
    return fleet, policies


def play(setup: RegionsSetup) -> dict[str, Any]:
    """Phases (a), (b) and (c) in one run; their numbers."""
    fleet, policies = run_phases(setup)
    first, cut_off = setup.regions[0], setup.cut_region
    policy = policies[first]
    admitted = _admitted(fleet, policy)
    everyone = sorted(p for points in admitted.values() for p in points)
    limit = float(setup.limit_tpm)
    report: dict[str, Any] = {
        "delay_ms": _delay_text(setup),
        "interval_s": setup.interval_s,
        "max_share_sum": _max_share_sum(fleet),
        "starting_share_sum": _max_share_sum(fleet, starting=True),
    }
    # (a): from the second minute on (every region's bucket drained by then at 2x).
    spread = (60.0, setup.move_at_s)
    report["a"] = {
        "first_minute_over_limit": _sum_between(everyone, 0.0, 60.0) / limit,
        "max_minute_over_limit": _window_max(everyone, *spread, 60.0) / limit,
        "max_10s_over_limit": _window_max(everyone, *spread, 10.0) / (limit / 6),
        "mean_minute_over_limit": _sum_between(everyone, *spread)
        / (limit * (spread[1] - spread[0]) / 60),
        "mean_share_sum": _mean_share_sum(fleet, *spread),
    }
    report["b"] = _moved(setup, fleet, admitted[first], limit)
    report["c"] = _cut(setup, fleet, admitted, everyone, cut_off, limit)
    return report


def _max_share_sum(fleet: RegionsFleet, starting: bool = False) -> float:
    """The most the regions' enforced shares of the tenant ever summed to (sampled), once
    every region had its first lease; `starting`: before that instead."""
    by_time: dict[float, float] = {}
    before: set[float] = set()
    for sample in fleet.samples:
        by_time[sample.at_s] = by_time.get(sample.at_s, 0.0) + (sample.share or 0.0)
        if sample.state == "none":
            before.add(sample.at_s)
    return max(
        (total for at_s, total in by_time.items() if (at_s in before) == starting), default=0.0
    )


def _mean_share_sum(fleet: RegionsFleet, start_s: float, end_s: float) -> float:
    """What the regions' enforced shares summed to on average from `start_s` to `end_s`:
    below 1, the part of the limit no region could use (held for a region that had
    asked for it, or granted to one whose demand has fallen)."""
    by_time: dict[float, float] = {}
    for sample in fleet.samples:
        if start_s <= sample.at_s < end_s:
            by_time[sample.at_s] = by_time.get(sample.at_s, 0.0) + (sample.share or 0.0)
    return sum(by_time.values()) / max(1, len(by_time))


def _first(samples: Sequence[tuple[float, Any]], test: Callable[[Any], bool]) -> float | None:
    return next((at_s for at_s, value in samples if test(value)), None)


def _moved(
    setup: RegionsSetup,
    fleet: RegionsFleet,
    points: Sequence[tuple[float, float]],
    limit: float,
) -> dict[str, Any]:
    """(b): seconds from the move until the first region holds 90% of the tenant, and until
    a 5 s window of its admissions runs at 90% of the limit."""
    start_s, end_s = setup.move_at_s, setup.move_at_s + setup.moved_s
    shares = [
        (s.at_s, s.share or 0.0)
        for s in fleet.samples
        if s.region == setup.regions[0] and start_s <= s.at_s < end_s
    ]
    held = _first(shares, lambda share: share >= RAMP_TARGET - 1e-9)
    width_s = 5.0
    rate_at: float | None = None
    steps = round((end_s - width_s - start_s) / 0.1)
    for step in range(steps + 1):
        lo = start_s + step * 0.1
        if _sum_between(points, lo, lo + width_s) >= RAMP_TARGET * limit * width_s / 60:
            rate_at = lo
            break
    return {
        "share_s": None if held is None else held - start_s,
        "admitted_s": None if rate_at is None else rate_at - start_s,
        "final_share": shares[-1][1] if shares else None,
        "bound_s": recovery_bound_s(setup),
    }


def recovery_bound_s(setup: RegionsSetup) -> float:
    """How soon a moved tenant's region must hold 90% of it, by budget.leases: within
    MOVE_REPORTS report intervals, plus a round trip for the others' last report to reach
    the ledger and one for the region's answer to come back."""
    return MOVE_REPORTS * setup.interval_s + 2 * (2 * max(setup.links_s.values()))


def _cut(
    setup: RegionsSetup,
    fleet: RegionsFleet,
    admitted: dict[str, list[tuple[float, float]]],
    everyone: Sequence[tuple[float, float]],
    region: str,
    limit: float,
) -> dict[str, Any]:
    """(c): the cut-off region's numbers and the reconciliation."""
    at_s, heal_s = setup.cut_at_s, setup.heal_at_s
    states = [(s.at_s, s.state) for s in fleet.samples if s.region == region]
    shares = [(s.at_s, s.share or 0.0) for s in fleet.samples if s.region == region]
    held_at_cut = next((share for t, share in reversed(shares) if t <= at_s), 0.0)
    seat = fleet.seats[region]
    answered_sent = [seat.sent_s[seq] for seq in seat.answered if seat.sent_s[seq] < at_s]
    last_ok_s = max(answered_sent, default=math.nan)
    cut_states = [(t, state) for t, state in states if at_s <= t]
    fallback_at = _first(cut_states, lambda state: state in ("fallback", "closed"))
    leased_again = _first(
        [(t, state) for t, state in states if t >= heal_s], lambda state: state == "leased"
    )
    on_fallback_s = sum(
        fleet.sample_s for t, state in states if at_s <= t < heal_s + 30 and state == "fallback"
    )
    cut_tokens = _sum_between(admitted[region], at_s, heal_s)
    expected = held_at_cut * limit * setup.cut_s / 60
    window = (at_s - 30.0, heal_s + 30.0)
    return {
        "region": region,
        "held_share": held_at_cut,
        "admitted_cut_off": cut_tokens,
        "admitted_over_held": cut_tokens / expected if expected else None,
        "last_answered_report_s": last_ok_s,
        "fallback_after_s": None if fallback_at is None else fallback_at - last_ok_s,
        "on_fallback_s": on_fallback_s,
        "leased_again_after_heal_s": None if leased_again is None else leased_again - heal_s,
        "max_minute_over_limit": _window_max(everyone, *window, 60.0) / limit,
        **reconciliation(fleet),
    }


def reconciliation(fleet: RegionsFleet) -> dict[str, Any]:
    """The global ledger's usage of the tenant (its last lease) against the sum of what
    the regions settled, and against what the regions' served requests used; and whether
    late duplicates changed it."""
    last = max(fleet.leases, key=lambda sent: sent.at_s)
    ledger_usage = last.lease.tenants[fleet.tenant].global_usage
    settled = sum(seat.usage.get(fleet.tenant, 0.0) for seat in fleet.seats.values())
    served = sum(
        tokens
        for seat in fleet.seats.values()
        for _, tokens in _admitted_of(seat.fleet, seat.fleet.policy)
    )
    duplicates_changed = False
    for at_s, answer in fleet.duplicates:
        before = [s for s in fleet.leases if s.at_s <= at_s]
        if before and fleet.tenant in answer.tenants:
            current = max(before, key=lambda sent: sent.at_s).lease.tenants[fleet.tenant]
            duplicates_changed |= answer.tenants[fleet.tenant].global_usage != current.global_usage
    return {
        "ledger_usage": ledger_usage,
        "regions_settled": settled,
        "served_tokens": served,
        # Exact: every count is a whole number of tokens (weight 1 below 8k tokens).
        "reconciled": ledger_usage == settled == served,
        "duplicates": len(fleet.duplicates),
        "duplicates_changed_usage": duplicates_changed,
    }


DEATH_AT_S = 90.0


def run_death(setup: RegionsSetup) -> tuple[RegionsFleet, dict[str, Policy]]:
    """Every region spending at twice the limit between them; at DEATH_AT_S the second
    region dies (no more reports, no more traffic); a minute past its share's return."""
    dies, dead_at_s = setup.regions[1], DEATH_AT_S
    end_s = dead_at_s + setup.lease_s + setup.fallback_for_s + 60.0
    fleet, policies = _fleet(setup, deaths={dies: dead_at_s})
    even = 1.0 / len(setup.regions)
    arrivals = {
        name: _stream(
            setup,
            policies[name],
            0.0,
            dead_at_s if name == dies else end_s,
            even,
            setup.seed * 1000 + index * 10,
        )
        for index, name in enumerate(setup.regions)
    }
    fleet.run(arrivals, end_s + setup.tail_s)
    return fleet, policies


def death(setup: RegionsSetup) -> dict[str, Any]:
    """A region's death (run_death): what the others hold of the tenant from then on, and
    when they get the dead region's share back."""
    fleet, policies = run_death(setup)
    dies, dead_at_s = setup.regions[1], DEATH_AT_S
    back_s = setup.lease_s + setup.fallback_for_s
    end_s = dead_at_s + back_s + 60.0
    others = [name for name in setup.regions if name != dies]
    by_time: dict[float, float] = {}
    for sample in fleet.samples:
        if sample.region in others and sample.at_s >= dead_at_s:
            by_time[sample.at_s] = by_time.get(sample.at_s, 0.0) + (sample.share or 0.0)
    held = [(t, by_time[t]) for t in sorted(by_time)]
    back_at = _first(held, lambda total: total >= 1.0 - 1e-6)
    # What the others hold while the ledger still holds the dead region's share for it
    # (its hold: what it enforced or was granted last, whichever is more).
    waiting = [total for t, total in held if dead_at_s + 15.0 <= t < (back_at or end_s) - 5.0]
    others_share = sum(waiting) / len(waiting) if waiting else None
    admitted = _admitted(fleet, policies[setup.regions[0]])
    others_points = sorted(p for name in others for p in admitted[name])
    limit = float(setup.limit_tpm)
    return {
        "delay_ms": _delay_text(setup),
        "interval_s": setup.interval_s,
        "region": dies,
        "others_share": others_share,
        "others_minute_over_limit": _sum_between(others_points, dead_at_s + 60.0, dead_at_s + 120.0)
        / limit,
        "back_after_s": None if back_at is None else back_at - dead_at_s,
        "expected_back_s": back_s,
        "others_minute_over_limit_after_back": None
        if back_at is None
        else _sum_between(others_points, back_at + 5.0, back_at + 65.0) / limit,
        "max_share_sum": _max_share_sum(fleet),
    }


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
    fleet = RegionsFleet(
        policies,
        setup.links_s,
        TENANT,
        seed=setup.seed,
        kv_capacity_tokens=2_000_000,
        max_running=512,
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


def sweep(
    base: RegionsSetup,
    delays_s: Sequence[float] = DELAYS_S,
    intervals_s: Sequence[float] = INTERVALS_S,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """(a)-(c) at every link delay and report interval; the death at the base's."""
    rows = []
    for delay_s in delays_s:
        for interval_s in intervals_s:
            setup = dataclasses.replace(base, delay_s=delay_s, interval_s=interval_s)
            rows.append(play(setup))
            progress(f"  {delay_s * 1000:.0f} ms one way, reports every {interval_s:g} s: done")
    lab = lab_setup(base.seed)
    report = {
        "setup": dataclasses.asdict(base),
        "rows": rows,
        "death": death(base),
        "lab_setup": dataclasses.asdict(lab),
        "lab": play(lab),
        "crossing": crossing(base),
    }
    progress("  the region's death and the lab's setup: done")
    return report


def _n(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _reconciled(cut: dict[str, Any]) -> str:
    text = "exact" if cut["reconciled"] else "NO"
    if cut["duplicates"]:
        text += "; late duplicate " + ("COUNTED" if cut["duplicates_changed_usage"] else "ignored")
    return text


_HEADER = (
    "| one-way delay | interval | (a) max minute / limit | (a) max 10 s / limit | "
    "(a) first minute / limit | (a) mean sum of shares | (b) s to 90% share | "
    "(b) s to 90% admitted | (b) bound s | (c) admitted cut off / held share | "
    "(c) fallback after lease s | (c) on fallback s | (c) leased again after heal s | "
    "(c) ledger = regions | max sum of shares |\n"
    "| --- |" + " --- |" * 14
)


def _line(row: dict[str, Any]) -> str:
    a, b, c = row["a"], row["b"], row["c"]
    return (
        f"| {row['delay_ms']} ms | {row['interval_s']:g} s | "
        f"{_n(a['max_minute_over_limit'], 3)} | {_n(a['max_10s_over_limit'], 3)} | "
        f"{_n(a['first_minute_over_limit'])} | {_n(a['mean_share_sum'], 3)} | "
        f"{_n(b['share_s'], 1)} | {_n(b['admitted_s'], 1)} | {_n(b['bound_s'], 1)} | "
        f"{_n(c['admitted_over_held'])} | {_n(c['fallback_after_s'], 1)} | "
        f"{_n(c['on_fallback_s'], 1)} | {_n(c['leased_again_after_heal_s'], 1)} | "
        f"{_reconciled(c)} | {_n(row['max_share_sum'], 4)} |"
    )


def _lab_lines(report: dict[str, Any]) -> list[str]:
    lab = report["lab_setup"]
    return [
        "",
        "The live lab's setup (`slogate bench regions`: one-way delays "
        f"{report['lab']['delay_ms']} ms for {', '.join(lab['regions'])}, "
        f"{lab['limit_tpm']:,} tokens/min asked {lab['demand_x']:g}x in "
        f"~{sum(lab['prompt_tokens']) // 2 + lab['output_tokens']:,}-token requests, "
        f"reports every {lab['interval_s']:g} s, lease_s {lab['lease_s']:g}, "
        f"fallback_for_s {lab['fallback_for_s']:g}, min_share {lab['min_share']:g}; (a) "
        f"{lab['spread_s'] - 60:g} s after the buckets drained, (b) {lab['moved_s']:g} s, "
        f"(c) {lab['regions'][lab['cut_index']]} cut off for {2 * lab['lease_s']:g} s) in "
        "the simulator, for the lab's table beside it:",
        "",
        _HEADER,
        _line(report["lab"]),
        "",
        "Few large requests (about two a second fleet-wide asked, one admitted) make each "
        "region's ask per report lumpy: the shares enforced sum to "
        f"{report['lab']['a']['mean_share_sum']:.2f} on average in (a), and each region "
        "admits a request only once its bucket has refilled all of it, so over 45 s the "
        f"fleet admits {report['lab']['a']['mean_minute_over_limit']:.2f} of the limit a "
        "minute: expect the lab's (a) well under 1 too.",
    ]


def _crossing_lines(d: dict[str, Any], where: str) -> list[str]:
    load = d["load"]
    rtts = ", ".join(f"{peer} {rtt * 1000:.0f} ms" for peer, rtt in d["link_rtt_s"].items())
    sent = ", ".join(f"{to}: {count}" for to, count in sorted(d["crossed_to"].items()))
    return [
        f"(d) Crossing ({where}; {d['region']}'s pool {load['kv_tokens']:,} KV tokens and "
        f"{load['slots']} batch slots, its waiting room {load['max_waiting']} a tier; "
        f"{load['sheddable_per_s']:g} sheddable and {load['critical_per_s']:g} critical "
        f"requests a second there, {load['own_per_s']:g} sheddable a second of the peers' "
        f"own; {load['duration_s']:g} s read from {load['warm_s']:g} s on): {d['crossed']} "
        f"of {d['region']}'s {d['sheddable']} sheddable requests crossed "
        f"({_n(d['crossed_share'])}; {sent or 'none'}), {d['sheddable_served_locally']} were "
        f"served there, {d['sheddable_refused']} refused; {d['critical_crossed']} of "
        f"{d['critical']} critical requests crossed ({d['critical_served_locally']} served "
        f"there). Time to first byte, median: crossed {_n(d['crossed_ttft_p50_s'])} s, the "
        f"peers' own sheddable {_n(d['peer_own_ttft_p50_s'])} s: "
        f"{_n(d['added_ttft_p50_s'])} s added (round trip to the peer's ingress: {rtts}; the "
        f"rest the peer's queue); {d['region']}'s sheddable served locally waited "
        f"{_n(d['local_sheddable_ttft_p50_s'], 1)} s. Skipped: {d['skipped'] or 'none'}; "
        f"tokens rejected: {d['tokens_rejected'] or 'none'}.",
    ]


def table(report: dict[str, Any]) -> str:
    setup = report["setup"]
    rows = report["rows"]
    lines = [
        f"{len(setup['regions'])} regions ({', '.join(setup['regions'])}), one global tenant "
        f"at {setup['limit_tpm']:,} tokens/min asking {setup['demand_x']:g}x it; lease_s "
        f"{setup['lease_s']:g}, fallback_for_s {setup['fallback_for_s']:g}, min_share "
        f"{setup['min_share']:g}; seed {setup['seed']}.",
        "",
        _HEADER,
        *(_line(row) for row in rows),
    ]
    if "lab" in report:
        lines += _lab_lines(report)
    starting = max(row["starting_share_sum"] for row in rows)
    means = [row["a"]["mean_share_sum"] for row in rows]
    lines += [
        "",
        f"The shares enforced summed to at most {max(r['max_share_sum'] for r in rows):.4f} "
        f"({starting:.4f} before every region had its first lease: a region enforces 0 "
        "until then). The first minute starts from full buckets (one bucket at the global "
        "limit would admit up to 2x its limit in it). Under contention "
        f"the shares enforced sum to {min(means):.2f}-{max(means):.2f} on average, and the "
        "fleet admits about that fraction of the limit: as the regions' asks move, a share "
        "one region gives up is freed at its next report (until then it still enforces it) "
        "and taken by another only at that one's next report.",
    ]
    d = report["death"]
    lines += [
        "",
        f"Region death ({d['delay_ms']} ms, reports every {d['interval_s']:g} s): "
        f"{d['region']} dies; the ledger keeps its share for it, so the others hold "
        f"{_n(d['others_share'])} of the tenant meanwhile (admitting "
        f"{_n(d['others_minute_over_limit'])} of the limit per minute) and get "
        f"its share back {_n(d['back_after_s'], 1)} s after the death (lease_s + "
        f"fallback_for_s = {d['expected_back_s']:g} s), then admit "
        f"{_n(d['others_minute_over_limit_after_back'])} of the limit per minute.",
        "",
        *_crossing_lines(report["crossing"], "80 ms one way, reports every 1 s"),
    ]
    return "\n".join(lines)
