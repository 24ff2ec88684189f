"""How the simulator's regions study is set up: `RegionsSetup` (the regions, the link, the
lease settings, the tenant and its traffic), `lab_setup` (the lab's numbers), each region's
policy (`region_policy`) and the fleet of regions built from them (`regions_fleet`), which
the phases and death (sim.studies.regions) and crossing (sim.studies.regions_crossing) run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policy._regions import LedgerConfig
from policy.loader import parse_policy
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, poisson_arrivals
from sim.fleet.regions import RegionsFleet
from sim.fleet.workload_files import SIMULATION_POLICY

TENANT = "acme"
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


def delay_text(setup: RegionsSetup) -> str:
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


def tenant_stream(
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


def regions_fleet(
    setup: RegionsSetup, policies: dict[str, Policy] | None = None, **options: Any
) -> tuple[RegionsFleet, dict[str, Policy]]:
    """The setup's regions as a fleet: each its policy (`policies`, else region_policy's)."""
    policies = policies or {name: region_policy(setup, name) for name in setup.regions}
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
