"""The lease arithmetic (budget.leases) and the region's lease holder (budget.lease_holder):
the rules one by one, then properties over random interleavings of reports, losses,
partitions, expiries and region deaths (hypothesis): the shares and spend ceilings held for
a tenant never sum past the limit, a region's lease never outlives the ledger's hold, a
moved tenant gets its budget within MOVE_REPORTS intervals, replays never double-count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budget.lease_holder import LeaseHolder
from budget.leases import (
    EPSILON,
    MOVE_REPORTS,
    Lease,
    LeaseSettings,
    LedgerBook,
    PoolRoom,
    Report,
    TenantReport,
    apply_report,
)
from policy._regions import Fallback
from tests.support.global_ledger_suite import DAY, SETTINGS, line


def report(region: str, seq: int, *lines: TenantReport) -> Report:
    return Report(region, seq, lines, {"chat": PoolRoom(level=0, waiting_full=False)})


def share(lease: Lease, tenant: str = "acme") -> float:
    return lease.tenants[tenant].share


# -- the rules ------------------------------------------------------------------------------


def test_shares_follow_demand_above_the_floor_once_holds_are_released() -> None:
    book = LedgerBook()
    assert share(apply_report(book, report("eu", 1, line(300)), 0.0, SETTINGS)) == 1.0
    # us: eu holds everything until its next report lowers its hold
    assert share(apply_report(book, report("us", 1, line(100)), 0.1, SETTINGS)) == 0.0
    eu = apply_report(book, report("eu", 2, line(300, applied=1.0)), 1.0, SETTINGS)
    assert share(eu) == pytest.approx(0.05 + 0.9 * 0.75)
    assert eu.peers == {"us": {"chat": PoolRoom(0, False)}}
    # eu still enforces 1.0 until its answer arrives: the ledger holds that for it
    assert share(apply_report(book, report("us", 2, line(100)), 1.1, SETTINGS)) == 0.0
    apply_report(book, report("eu", 3, line(300, applied=share(eu))), 2.0, SETTINGS)
    us = apply_report(book, report("us", 3, line(100)), 2.1, SETTINGS)
    assert share(us) == pytest.approx(0.05 + 0.9 * 0.25)
    assert us.rebalanced == 1


def test_equal_shares_while_nobody_has_demand() -> None:
    book = LedgerBook()
    for seq, region in enumerate(["a", "b", "c", "a", "b", "c"]):
        lease = apply_report(book, report(region, seq, line(0)), 0.1 * seq, SETTINGS)
    assert share(lease) == pytest.approx(1 / 3)


def test_demand_halves_per_quiet_report_instead_of_vanishing() -> None:
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(100)), 0.0, SETTINGS)
    apply_report(book, report("us", 1, line(100)), 0.0, SETTINGS)
    apply_report(book, report("eu", 2, line(0)), 1.0, SETTINGS)  # one quiet interval
    assert book.tenants["acme"]["eu"].demand == 50.0
    apply_report(book, report("eu", 3, line(200)), 2.0, SETTINGS)  # a rise counts at once
    assert book.tenants["acme"]["eu"].demand == 200.0


def test_a_report_not_newer_than_the_stored_one_changes_nothing_and_grants_nothing() -> None:
    book = LedgerBook()
    apply_report(book, report("eu", 5, line(10, usage=100.0, spent=3.0)), 0.0, SETTINGS)
    for seq in (5, 4, 0):  # a replay, a late one, a restarted holder starting from 0
        lease = apply_report(book, report("eu", seq, line(10, usage=999.0)), 1.0, SETTINGS)
        assert (lease.seq, lease.lease_s, lease.rebalanced) == (5, 0.0, 0)
        assert lease.tenants["acme"].global_usage == 100.0
    assert book.tenants["acme"]["eu"].usage == 100.0


def test_cumulative_usage_and_spend_are_stored_not_added() -> None:
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(1, usage=100.0, spent=2.0)), 0.0, SETTINGS)
    apply_report(book, report("us", 1, line(1, usage=50.0, spent=1.0)), 0.0, SETTINGS)
    lease = apply_report(book, report("eu", 2, line(1, usage=120.0, spent=2.5)), 1.0, SETTINGS)
    assert lease.tenants["acme"].global_usage == 170.0
    assert lease.tenants["acme"].global_spend == {DAY: 3.5}


def test_a_silent_region_keeps_its_hold_then_its_fallback_then_nothing() -> None:
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(100)), 0.0, SETTINGS)  # eu: 1.0, then silent
    at_lease = apply_report(book, report("us", 1, line(100)), 9.0, SETTINGS)
    at_fallback = apply_report(book, report("us", 2, line(100)), 10.5, SETTINGS)
    after = apply_report(book, report("us", 3, line(100)), 40.5, SETTINGS)
    assert (share(at_lease), share(at_fallback), share(after)) == (0.0, 0.0, 1.0)
    assert "eu" not in after.peers


def test_a_fixed_fallback_share_is_capped_at_the_share_held() -> None:
    capped = LeaseSettings(10.0, 30.0, 0.05, fallback_share=0.3)
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(100)), 0.0, capped)
    apply_report(book, report("us", 1, line(100)), 0.0, capped)
    apply_report(book, report("eu", 2, line(100, applied=1.0)), 1.0, capped)  # eu holds 1.0
    assert share(apply_report(book, report("us", 2, line(100)), 11.5, capped)) == 0.7
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(0)), 0.0, capped)
    apply_report(book, report("us", 1, line(100)), 0.0, capped)
    apply_report(book, report("eu", 2, line(0, applied=1.0)), 1.0, capped)
    eu = apply_report(book, report("eu", 3, line(0, applied=0.05)), 2.0, capped)
    assert share(eu) == 0.05
    assert book.tenants["acme"]["eu"].fallback == 0.05  # never more than it held


def test_spend_ceilings_never_sum_past_the_limit_when_each_region_sees_the_other_stale() -> None:
    # Shares settle at a half each; each region then spends its ceiling and reports while
    # the other's spend is still unreported. A share of the remaining alone would give the
    # first to report 50 + 0.5 x (100 - 50) = 75: 125 in all.
    book = LedgerBook()
    held = {"eu": 0.0, "us": 0.0}
    ceiling = {"eu": 0.0, "us": 0.0}
    spent = {"eu": 0.0, "us": 0.0}

    def turn(region: str, seq: int, now: float) -> None:
        lease = apply_report(
            book,
            report(region, seq, line(1, held[region], 0, spent[region], 100.0, ceiling[region])),
            now,
            SETTINGS,
        )
        held[region] = share(lease)
        ceiling[region] = lease.tenants["acme"].spend_ceiling[DAY]

    for seq in range(1, 4):
        turn("eu", seq, seq)
        turn("us", seq, seq + 0.5)
    assert held == {"eu": 0.5, "us": 0.5}
    assert ceiling == {"eu": 50.0, "us": 50.0}
    spent = dict(ceiling)  # both spend all of it before either reports
    turn("eu", 4, 4.0)
    turn("us", 4, 4.5)
    assert ceiling == {"eu": 50.0, "us": 50.0}  # nothing left to grant
    assert sum(ceiling.values()) <= 100.0


def test_a_window_no_live_region_reports_is_forgotten() -> None:
    book = LedgerBook()
    apply_report(book, report("eu", 1, line(1, spent=5.0, limit=10.0)), 0.0, SETTINGS)
    nxt = TenantReport("acme", 1, 0, {"day:2026-12-06": 0.0}, 1.0, {"day:2026-12-06": 10.0})
    lease = apply_report(book, report("eu", 2, nxt), 1.0, SETTINGS)
    assert lease.tenants["acme"].global_spend == {"day:2026-12-06": 0.0}


# -- the holder -----------------------------------------------------------------------------


def holder(
    limits: Fallback = Fallback.SHARE, spend: Fallback = Fallback.CLOSED, **kw: float | None
) -> LeaseHolder:
    return LeaseHolder(LeaseSettings(10.0, 30.0, 0.05, **kw), limits, spend)  # type: ignore[arg-type]


def granted(
    sent_s: float, held: LeaseHolder, share_: float = 0.6, ceiling: float = 40.0, seq: int = 1
) -> None:
    book = LedgerBook()
    apply_report(book, report("us", 0, line(0)), 0.0, SETTINGS)  # someone else holds 1 - share
    lease = apply_report(
        book, report("eu", seq, line(1, spent=10.0, limit=100.0)), sent_s, SETTINGS
    )
    line_ = lease.tenants["acme"]
    fixed = type(line_)(share_, line_.global_usage, line_.global_spend, {DAY: ceiling})
    held.sent(sent_s)
    held.received(Lease("eu", seq, 10.0, {"acme": fixed}, {}, 0))


def test_the_holder_leases_from_the_send_then_falls_back_then_closes() -> None:
    held = holder()
    assert (held.state(0.0), held.share("acme", 0.0)) == ("none", None)
    assert held.spend_allowance("acme", DAY, 100.0, 7.0, 0.0) == 7.0  # nothing more
    granted(100.0, held)
    assert (held.state(109.9), held.share("acme", 109.9)) == ("leased", 0.6)
    assert held.spend_allowance("acme", DAY, 100.0, 12.0, 109.9) == 40.0
    held.sent(105.0)
    held.failed(105.5)
    assert held.state(109.9) == "cut_off"
    assert (held.state(110.0), held.share("acme", 110.0)) == ("fallback", 0.6)
    assert held.spend_allowance("acme", DAY, 100.0, 12.0, 110.0) == 12.0  # closed: no more
    assert (held.state(140.0), held.share("acme", 140.0)) == ("closed", 0.0)


def test_the_holder_fallback_rules() -> None:
    assert _fallback_share(holder(fallback_share=0.2)) == 0.2
    assert _fallback_share(holder(fallback_share=0.9)) == 0.6  # capped at the share held
    assert _fallback_share(holder(Fallback.CLOSED)) == 0.0
    spend_share = holder(spend=Fallback.SHARE)
    granted(0.0, spend_share)
    assert spend_share.spend_allowance("acme", DAY, 30.0, 12.0, 20.0) == 30.0  # capped at limit
    assert spend_share.spend_allowance("acme", DAY, 100.0, 12.0, 40.0) == 12.0  # closed


def _fallback_share(held: LeaseHolder) -> float | None:
    granted(0.0, held)
    return held.share("acme", 15.0)


def test_the_holder_ignores_stale_unsolicited_and_ungranting_answers() -> None:
    held = holder()
    granted(0.0, held, share_=0.6, seq=5)
    held.received(Lease("eu", 6, 10.0, {}, {}, 0))  # nothing in flight
    held.sent(1.0)
    held.received(Lease("eu", 4, 10.0, {}, {}, 0))  # older than the one held
    held.sent(2.0)
    held.received(Lease("eu", 9, 0.0, {}, {}, 0))  # a replayed report's answer
    assert held.expires_in_s(0.0) == 10.0
    assert held.seq == 9  # the next report starts from 10


# -- properties -------------------------------------------------------------------------------

REGIONS = ("eu", "us", "ap")
TENANTS = ("acme", "globex")
LIMIT = 1000.0
TIMEOUT_S = 0.5


@dataclass
class Region:
    name: str
    held: LeaseHolder
    seq: int = 0
    usage: dict[str, float] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)
    in_flight: Report | None = None
    sent_s: float = 0.0
    answer: Lease | None = None
    dead: bool = False
    cut_until_s: float = 0.0  # partitioned: its messages are lost until then


class World:
    """Regions, a ledger, messages in flight, one clock; checks the invariants after each
    step."""

    def __init__(self, lease: LeaseSettings) -> None:
        self.settings = lease
        self.book = LedgerBook()
        self.now = 0.0
        self.regions = {
            name: Region(name, LeaseHolder(lease, Fallback.SHARE, Fallback.SHARE))
            for name in REGIONS
        }
        self.delivered: list[Report] = []  # every report the ledger has taken, for replays
        self.reported_usage: dict[tuple[str, str], float] = {}

    def send(self, r: Region) -> None:
        if r.dead or r.in_flight is not None:
            return
        r.seq = max(r.seq + 1, r.held.seq + 1)
        lines = tuple(
            TenantReport(
                t,
                r.demand.get(t, 0.0),
                r.usage.get(t, 0.0),
                {DAY: r.spent.get(t, 0.0)},
                r.held.applied(t, self.now),
                {DAY: LIMIT},
                r.held.spend_ceilings(t, self.now),
            )
            for t in TENANTS
        )
        r.in_flight, r.sent_s = report(r.name, r.seq, *lines), self.now
        r.held.sent(self.now)

    def arrive(self, r: Region) -> None:
        """The report in flight reaches the ledger (or is lost in a partition)."""
        if r.in_flight is None or r.answer is not None:
            return
        if self.now >= r.cut_until_s:
            r.answer = apply_report(self.book, r.in_flight, self.now, self.settings)
            self.delivered.append(r.in_flight)
            for t in r.in_flight.tenants:
                if r.answer.lease_s > 0:
                    self.reported_usage[(r.name, t.tenant)] = t.usage

    def answer(self, r: Region) -> None:
        if r.answer is None or r.dead:
            return
        if self.now - r.sent_s >= TIMEOUT_S or self.now < r.cut_until_s:
            return  # too late or lost: its timeout will fire
        r.held.received(r.answer)
        r.in_flight = r.answer = None

    def time_out(self, r: Region) -> None:
        if r.in_flight is not None and self.now - r.sent_s >= TIMEOUT_S:
            r.held.failed(self.now)
            r.in_flight = r.answer = None

    def replay(self, index: int) -> None:
        if self.delivered:
            old = self.delivered[index % len(self.delivered)]
            before = {
                k: (v.usage, dict(v.spend))
                for t in self.book.tenants.values()
                for k, v in t.items()
            }
            lease = apply_report(self.book, old, self.now, self.settings)
            assert lease.lease_s == 0.0
            after = {
                k: (v.usage, dict(v.spend))
                for t in self.book.tenants.values()
                for k, v in t.items()
            }
            assert after == before

    def use(self, r: Region, tenant: str, amount: float) -> None:
        """The region serves: usage grows, demand is recorded, spend reaches its allowance."""
        if r.dead:
            return
        r.usage[tenant] = r.usage.get(tenant, 0.0) + amount
        r.demand[tenant] = amount
        spent = r.spent.get(tenant, 0.0)
        r.spent[tenant] = max(spent, r.held.spend_allowance(tenant, DAY, LIMIT, spent, self.now))

    def check(self) -> None:
        for tenant, regions in self.book.tenants.items():
            holds = {name: rec.hold(self.now) for name, rec in regions.items()}
            assert sum(holds.values()) <= 1.0 + EPSILON, (tenant, holds)
            committed = sum(
                max(rec.spend.get(DAY, 0.0), rec.ceiling.get(DAY, 0.0)) for rec in regions.values()
            )
            assert committed <= LIMIT + 1e-6, (tenant, committed)
            for r in self.regions.values():
                enforced = r.held.share(tenant, self.now) or 0.0
                assert enforced <= holds.get(r.name, 0.0) + EPSILON, (
                    r.name,
                    tenant,
                    enforced,
                    holds,
                )
            usage = sum(u for (_, t), u in self.reported_usage.items() if t == tenant)
            assert sum(rec.usage for rec in regions.values()) == pytest.approx(usage)
        for tenant in TENANTS:
            enforced = sum(r.held.share(tenant, self.now) or 0.0 for r in self.regions.values())
            assert enforced <= 1.0 + EPSILON
            assert sum(r.spent.get(tenant, 0.0) for r in self.regions.values()) <= LIMIT + 1e-6


# Weighted so that most reports get answered and regions spend between them, with the odd
# loss, partition, death, restart and replay: uniform draws rarely build a settled lease.
STEPS = {
    "cycle": 30,
    "use": 30,
    "advance": 12,
    "send": 3,
    "arrive": 3,
    "answer": 3,
    "time_out": 3,
    "partition": 3,
    "die": 1,
    "restart": 2,
    "replay": 4,
}


def run_world(rng: random.Random, world: World, steps: int) -> None:
    kinds, weights = list(STEPS), list(STEPS.values())
    for _ in range(steps):
        kind = rng.choices(kinds, weights)[0]
        region = world.regions[rng.choice(REGIONS)]
        if kind == "advance":
            world.now += rng.uniform(0.01, 4.0)
        elif kind == "use":
            world.use(region, rng.choice(TENANTS), rng.uniform(0.0, 200.0))
        elif kind == "partition":
            region.cut_until_s = world.now + rng.uniform(0.5, 60.0)
        elif kind == "die":
            region.dead = True
        elif kind == "restart":  # a fresh holder, its seq lost
            world.regions[region.name] = Region(
                region.name,
                LeaseHolder(world.settings, Fallback.SHARE, Fallback.SHARE),
                usage=region.usage,
                spent=region.spent,
            )
        elif kind == "replay":
            world.replay(rng.randrange(1000))
        elif kind == "cycle":  # one report and its answer, `delay` s each way
            delay = rng.uniform(0.0, 0.4)
            world.send(region)
            world.now += delay
            world.arrive(region)
            world.now += delay
            world.answer(region)
            world.time_out(region)
        else:
            getattr(world, kind)(region)
        world.check()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    fallback_share=st.sampled_from([None, 0.1, 0.5]),
    min_share=st.sampled_from([0.0, 0.05, 0.4]),
)
def test_the_invariants_hold_under_any_order_of_reports_losses_partitions_and_deaths(
    seed: int, fallback_share: float | None, min_share: float
) -> None:
    world = World(LeaseSettings(10.0, 20.0, min_share, fallback_share))
    run_world(random.Random(seed), world, 150)


@pytest.mark.parametrize("seed", range(20))
def test_a_moved_tenant_gets_nine_tenths_of_its_limit_within_move_reports_intervals(
    seed: int,
) -> None:
    rng = random.Random(seed)
    book = LedgerBook()
    applied = {"a": 0.0, "b": 0.0}
    seq = {"a": 0, "b": 0}
    now = 0.0

    def round_(demand: dict[str, float]) -> None:
        # One report interval (1 s), each region reporting once at any moment within it,
        # in any order.
        nonlocal now
        start = now
        moments = sorted(start + rng.uniform(0.0, 1.0) for _ in range(2))
        for region, moment in zip(rng.sample(["a", "b"], 2), moments, strict=True):
            now = moment
            seq[region] += 1
            lease = apply_report(
                book,
                report(region, seq[region], line(demand[region], applied[region])),
                now,
                SETTINGS,
            )
            applied[region] = share(lease)
        now = start + 1.0

    for _ in range(10):  # the tenant lives in a
        round_({"a": 1000.0, "b": 0.0})
    assert applied["a"] >= 0.9
    intervals = 0
    while applied["b"] < 0.9 and intervals < 20:  # it moves to b: refused there, so b's
        round_({"a": 0.0, "b": 1000.0})  # demand is all of it
        intervals += 1
    assert intervals <= MOVE_REPORTS


@pytest.mark.parametrize("offset", [0.1, 0.5, 0.9])
def test_the_split_does_not_depend_on_the_order_of_the_reports(offset: float) -> None:
    """Equal demand reported at different moments of each interval splits evenly, and a
    tenant gone idle everywhere ends split evenly with nothing held by nobody (decaying on
    report counts alone, the first to report looked quieter: 0.18 + 0.73 held)."""
    book = LedgerBook()
    applied = {"eu": 0.0, "us": 0.0}

    def interval(k: int, demand: float) -> None:
        for region, moment in (("eu", float(k)), ("us", k + offset)):
            lease = apply_report(
                book, report(region, k, line(demand, applied[region])), moment, SETTINGS
            )
            applied[region] = share(lease)

    for k in range(1, 8):
        interval(k, 200.0)
    assert applied == {"eu": pytest.approx(0.5), "us": pytest.approx(0.5)}
    for k in range(8, 30):
        interval(k, 0.0)
    assert applied == {"eu": pytest.approx(0.5), "us": pytest.approx(0.5)}
