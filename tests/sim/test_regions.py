"""Regions in the simulator (sim.fleet.regions, sim.studies.regions): one global tenant
over three regions, each a fleet running the sidecar's admission chain with its lease
holder's share, one global ledger (budget.leases.apply_report) over a delayed link.

Each property below fails if the lease is not what bounds the fleet: a region enforcing
its whole limit admits twice the global limit here, a share applied before its answer
arrived or a hold released early sums past 1, a report counted twice breaks the
reconciliation, a lease measured from its arrival instead of its send falls back late.
"""

from __future__ import annotations

import dataclasses

import pytest

from budget.leases import MOVE_REPORTS
from sim.fleet.regions import RegionsFleet
from sim.studies.regions import DEATH_AT_S, death, play, recovery_bound_s, run_phases
from sim.studies.regions_crossing import crossing, run_crossing
from sim.studies.regions_setup import RegionsSetup

# Short phases at half the study's rate: ~1 s of CPU per run.
SETUP = RegionsSetup(
    limit_tpm=300_000,
    lease_s=5.0,
    fallback_for_s=15.0,
    spread_s=120.0,
    moved_s=40.0,
    rejoined_s=20.0,
    after_heal_s=20.0,
    tail_s=20.0,
    seed=3,
)
# The largest request: prompt and output tokens at weight 1.
LARGEST = SETUP.prompt_tokens[1] + SETUP.output_tokens


@pytest.fixture(scope="module")
def phases() -> tuple[RegionsFleet, dict]:
    fleet, _ = run_phases(SETUP)
    return fleet, play(SETUP)


def test_overshoot_bounded_by_the_guarantee(phases: tuple[RegionsFleet, dict]) -> None:
    """The shares the regions enforce never sum past 1, so the fleet admits at most the
    global limit a minute once the first minute's full buckets are spent (plus a request
    per region: a bucket admits a request while it has room for it), with the tenant
    asking twice that from every region at once."""
    fleet, report = phases
    assert report["max_share_sum"] <= 1.0 + 1e-9
    slack = len(SETUP.regions) * LARGEST / SETUP.limit_tpm
    assert report["a"]["max_minute_over_limit"] <= 1.0 + slack
    assert report["c"]["max_minute_over_limit"] <= 1.0 + slack  # through the partition
    # From full buckets: what one bucket at the global limit admits in a minute at most.
    assert report["a"]["first_minute_over_limit"] <= 2.0 + slack
    # Not a vacuous bound: the fleet does admit near the limit.
    assert report["a"]["mean_minute_over_limit"] > 0.75
    assert len(fleet.leases) > 100


def test_moved_tenant_recovers_within_the_bound(phases: tuple[RegionsFleet, dict]) -> None:
    """The tenant moves to one region: that region holds 90% of the tenant, and admits at
    90% of the limit, within MOVE_REPORTS intervals and two round trips."""
    _, report = phases
    moved = report["b"]
    assert moved["bound_s"] == recovery_bound_s(SETUP)
    assert recovery_bound_s(SETUP) == MOVE_REPORTS * SETUP.interval_s + 4 * SETUP.delay_s
    assert moved["share_s"] is not None and moved["share_s"] <= moved["bound_s"]
    assert moved["admitted_s"] is not None and moved["admitted_s"] <= moved["bound_s"]
    assert moved["final_share"] == pytest.approx(1 - 2 * SETUP.min_share)


def test_reconciliation_exact(phases: tuple[RegionsFleet, dict]) -> None:
    """After the heal, the global ledger's usage of the tenant is exactly what the regions
    settled, and what their engines ran; a report from before the cut arriving late
    changed nothing."""
    _, report = phases
    cut = report["c"]
    assert cut["ledger_usage"] == cut["regions_settled"] == cut["served_tokens"]
    assert cut["reconciled"]
    assert cut["admitted_cut_off"] > 0  # the cut-off region's usage is in it
    assert cut["duplicates"] == 1 and not cut["duplicates_changed_usage"]


def test_partition_region_falls_back_after_lease_s(phases: tuple[RegionsFleet, dict]) -> None:
    """Cut off, the region serves on its lease until lease_s after the last report that
    was answered left, then on its fallback (its last share) until the heal; and it
    admits no more than that share's bucket allows meanwhile."""
    fleet, report = phases
    cut = report["c"]
    region = cut["region"]
    expires_s = cut["last_answered_report_s"] + SETUP.lease_s
    # The first report after the cut leaves within an interval and fails timeout_s later.
    noticed_s = SETUP.cut_at_s + SETUP.interval_s + fleet.timeout_s
    states = [
        (s.at_s, s.state)
        for s in fleet.samples
        if s.region == region and noticed_s < s.at_s < SETUP.heal_at_s
    ]
    assert {state for at_s, state in states if at_s < expires_s} == {"cut_off"}
    assert {state for at_s, state in states if at_s >= expires_s} == {"fallback"}
    assert SETUP.lease_s <= cut["fallback_after_s"] <= SETUP.lease_s + fleet.sample_s + 1e-9
    shares = {round(s.share or 0.0, 12) for s in fleet.samples if s.region == region}
    assert round(cut["held_share"], 12) in shares
    bucket = cut["held_share"] * SETUP.limit_tpm
    assert cut["admitted_cut_off"] <= bucket * (1 + SETUP.cut_s / 60) + LARGEST
    assert cut["leased_again_after_heal_s"] <= SETUP.interval_s + 2 * SETUP.delay_s + 0.1


def test_a_dead_region_keeps_its_share_until_its_lease_and_fallback_end() -> None:
    """A region dies: the ledger holds its share for lease_s + fallback_for_s after its
    last report, then the other two take it at their next reports; never more than 1."""
    setup = dataclasses.replace(SETUP, spread_s=60.0)
    report = death(setup)
    back_s = setup.lease_s + setup.fallback_for_s
    assert report["max_share_sum"] <= 1.0 + 1e-9
    assert report["others_share"] is not None and report["others_share"] < 1.0 - setup.min_share
    # Its last report left at most an interval before it died.
    assert back_s - setup.interval_s <= report["back_after_s"]
    assert report["back_after_s"] <= back_s + 2 * setup.interval_s + 4 * setup.delay_s
    assert DEATH_AT_S + report["back_after_s"] < DEATH_AT_S + back_s + 60.0


def test_tolerant_requests_of_a_saturated_region_cross_and_critical_stay() -> None:
    """(d): a region's pool saturated: its sheddable requests go to a peer (the crossing
    decision and tokens are admission.crossing's and the desk's), each paying at least the
    WAN's round trip, and never sent on; its critical ones stay."""
    fleet, _ = run_crossing(SETUP)
    report = crossing(SETUP, fleet)
    assert report["crossed"] > 0 and report["crossed_failed"] == 0
    assert report["critical"] > 0 and report["critical_crossed"] == 0
    assert report["critical_served_locally"] == report["critical"]
    assert report["tokens_rejected"] == {}
    saturated = SETUP.regions[-1]
    rtt_s = min(report["link_rtt_s"].values())
    origin = fleet.seats[saturated].fleet.results.values()
    crossed = [s for s in origin if s.outcome == "crossed"]
    assert all(s.ttft_s is not None and s.ttft_s >= rtt_s for s in crossed)
    assert report["added_ttft_p50_s"] >= rtt_s
    for name, seat in fleet.seats.items():
        arrived = [rid for rid in seat.fleet.results if ":" in rid]
        if name == saturated:
            assert not arrived
            continue
        # What came from the saturated region never crossed again.
        assert all(not seat.fleet.results[rid].outcome.startswith("crossed") for rid in arrived)
