"""Tenant A bursting 10x must not move tenant B's P99 TTFT by more than 10%.

Run in the offline fleet (sim.fleet.offline): the real policy, budget ledger, breaker board and
shedding table on a virtual clock, in front of the simulated engine (KV cache, FIFO queue,
latency model). Same seeds in every run; only tenant A's traffic differs.
"""

from __future__ import annotations

import pytest

from policy.loader import parse_policy
from policy.quantiles import quantile
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, poisson_arrivals
from sim.fleet.offline import OfflineFleet


def isolation_policy() -> Policy:
    return parse_policy(
        {
            "breaker": {
                "window_s": 30,
                "thresholds": {"enter_hold_s": [5, 5, 5], "cooldown_s": 30, "probe_hold_s": 15},
            },
            "keys": [
                {"key": "b", "tenant": "b", "tier": "critical"},
                # A's per-key pool: what an operator gives a batch tenant that normally runs
                # 3 requests/s of ~5 s each (about 15 in flight).
                {
                    "key": "a",
                    "tenant": "a",
                    "tier": "sheddable",
                    "limits": {
                        "requests_per_minute": 600,
                        "tokens_per_minute": 3_000_000,
                        "concurrent_requests": 24,
                    },
                },
            ],
        }
    )


POLICY = isolation_policy()
B = POLICY.key_for("b")
A = POLICY.key_for("a")
assert A is not None and B is not None
B_TRAFFIC = poisson_arrivals(B, 3.0, 0, 300, (500, 2000), 256, seed=1)
A_BASELINE = poisson_arrivals(A, 3.0, 0, 300, (1000, 4000), 512, seed=2)
A_BURST = A_BASELINE + poisson_arrivals(A, 27.0, 120, 150, (1000, 4000), 512, seed=3)  # 10x


def b_p99(a_traffic: list[Arrival], **options: bool) -> float:
    fleet = OfflineFleet(POLICY, seed=7, **options)
    results = fleet.run(sorted(B_TRAFFIC + a_traffic, key=lambda x: x.at_s), until_s=320)
    ttfts = [r.ttft_s for r in results.values() if r.arrival.key is B and r.ttft_s is not None]
    assert len(ttfts) == len(B_TRAFFIC)  # every one of B's requests was served
    return quantile(ttfts, 0.99)


def test_burst_does_not_move_the_other_tenants_p99() -> None:
    quiet = b_p99(A_BASELINE)
    bursting = b_p99(A_BURST)
    assert bursting <= 1.10 * quiet, (quiet, bursting)


def test_without_per_key_pools_and_breaker_the_burst_does_hurt() -> None:
    """The control: the same burst with budgets and breaker off. If this did not hurt B, the
    test above could not fail and would prove nothing."""
    quiet = b_p99(A_BASELINE, budgets=False, breaker=False)
    bursting = b_p99(A_BURST, budgets=False, breaker=False)
    assert bursting > 2.0 * quiet, (quiet, bursting)


def test_offline_fleet_is_deterministic_for_a_seed() -> None:
    runs = []
    for _ in range(2):
        results = OfflineFleet(POLICY, seed=3).run(
            sorted(B_TRAFFIC + A_BURST, key=lambda x: x.at_s), until_s=320
        )
        runs.append({k: (r.outcome, r.ttft_s, r.done_s) for k, r in results.items()})
    assert runs[0] == runs[1]


@pytest.mark.parametrize("breaker", [True, False])
def test_burst_is_refused_by_the_tenants_own_budget(breaker: bool) -> None:
    results = OfflineFleet(POLICY, seed=7, breaker=breaker).run(
        sorted(B_TRAFFIC + A_BURST, key=lambda x: x.at_s), until_s=320
    )
    refused_a = sum(
        1 for r in results.values() if r.arrival.key is A and r.outcome in ("budget", "shed")
    )
    refused_b = sum(1 for r in results.values() if r.arrival.key is B and r.outcome != "served")
    assert refused_a > 500 and refused_b == 0


def test_controller_runs_in_the_offline_fleet() -> None:
    """The simulator drives the real controller: under a sustained overload it shrinks the
    sheddable tier first, over twenty simulated minutes of traffic."""
    b_arrivals = poisson_arrivals(B, 3.0, 0, 1200, (500, 2000), 256, seed=11)
    a_arrivals = poisson_arrivals(A, 6.0, 0, 1200, (4000, 8000), 1024, seed=12)
    fleet = OfflineFleet(POLICY, seed=5, controller=True, kv_capacity_tokens=150_000)
    results = fleet.run(sorted(b_arrivals + a_arrivals, key=lambda x: x.at_s), until_s=1200)
    assert len(results) == len(b_arrivals) + len(a_arrivals)
    assert fleet.multiplier_history, "the controller never moved"
    first_moves = [values for _, values in fleet.multiplier_history[:3]]
    assert first_moves[0]["sheddable"] < 1.0 and first_moves[0]["critical"] == 1.0
