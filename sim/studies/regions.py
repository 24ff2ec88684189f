"""Regions in the simulator: the lab's phases (`slogate bench regions`) on the virtual clock.

What lives here (the setup, `RegionsSetup` and the fleet built from it, is
sim.studies.regions_setup): `play` (one run of the phases: (a) one global tenant spending
from every region at once at twice its global limit, (b) the tenant moving to one region, (c) one
region cut off from the global ledger for about twice lease_s and healed) and `death` (a
region dying while the others spend); crossing (d) is sim.studies.regions_crossing, the
sweep over link delays and report intervals and its table sim.studies.regions_report.
The regions are sim.fleet.regions': each a fleet running the sidecar's admission chain
with its own budget store, one in-process global ledger (budget.leases' apply_report),
each region's lease holder (budget.lease_holder) over a link with a delay.

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

import math
from collections.abc import Callable, Sequence
from typing import Any

from budget.leases import MOVE_REPORTS
from policy.schema import Policy
from sim.fleet.arrivals import Arrival
from sim.fleet.fleet_types import Served
from sim.fleet.offline import OfflineFleet
from sim.fleet.regions import Cut, RegionsFleet
from sim.studies.regions_setup import RegionsSetup, delay_text, regions_fleet, tenant_stream

DELAYS_S = (0.04, 0.08, 0.15)  # one way, as the lab's relay delays the WAN
INTERVALS_S = (0.5, 1.0, 2.0)
RAMP_TARGET = 0.9  # (b): the moved tenant's region at 90% of the global limit


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
    fleet, policies = regions_fleet(
        setup, cuts=(Cut(setup.cut_region, setup.cut_at_s, setup.heal_at_s),)
    )
    first = setup.regions[0]
    arrivals: dict[str, list[Arrival]] = {}
    even = 1.0 / len(setup.regions)
    for index, name in enumerate(setup.regions):
        policy = policies[name]
        seed = setup.seed * 1000 + index * 10
        arrivals[name] = tenant_stream(setup, policy, 0.0, setup.move_at_s, even, seed)
        if name == first:
            arrivals[name] += tenant_stream(
                setup, policy, setup.move_at_s, setup.move_at_s + setup.moved_s, 1.0, seed + 1
            )
        rejoin_s = setup.move_at_s + setup.moved_s
        arrivals[name] += tenant_stream(
            setup, policy, rejoin_s, setup.arrivals_end_s, even, seed + 2
        )
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
        "delay_ms": delay_text(setup),
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
    fleet, policies = regions_fleet(setup, deaths={dies: dead_at_s})
    even = 1.0 / len(setup.regions)
    arrivals = {
        name: tenant_stream(
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
        "delay_ms": delay_text(setup),
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
