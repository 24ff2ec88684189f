"""32 concurrent crafted prompts must not move a critical tenant's P99 TTFT by more than 10%,
in the offline fleet: the real ledger, breaker, shedding and KV admission on a virtual clock
in front of the simulated engine.

The crafted prompts are random letters just under the long pool's edge: ~30k real tokens
that the fitted estimate took for ~3k (tests/data/hostile/: random_mixed_case, 10x). The
sidecar counts them exactly now; the control runs the same flood counted as the estimate
counted it, and shows what that did to the critical tenant.
"""

from __future__ import annotations

import dataclasses

from policy.loader import parse_policy
from policy.quantiles import quantile
from sim.fleet.arrivals import Arrival, poisson_arrivals
from sim.fleet.offline import OfflineFleet

CAPACITY = 400_000  # the simulated engine's KV cache, weighted tokens
POLICY = parse_policy(
    {
        "pools": {
            "default": {"endpoints": ["127.0.0.1:1"], "kv_capacity_tokens": CAPACITY},
            "long": {"endpoints": ["127.0.0.1:2"], "kv_capacity_tokens": CAPACITY},
            "fallback": {"endpoints": ["127.0.0.1:3"], "kv_capacity_tokens": CAPACITY},
        },
        "keys": [
            {"key": "critical", "tenant": "support", "tier": "critical"},
            {
                "key": "attacker",
                "tenant": "attacker",
                "tier": "standard",
                "limits": {"concurrent_requests": 64, "tokens_per_minute": 100_000_000},
            },
        ],
    }
)
CRITICAL = POLICY.key_for("critical")
ATTACKER = POLICY.key_for("attacker")
assert CRITICAL is not None and ATTACKER is not None
SUPPORT = poisson_arrivals(CRITICAL, 3.0, 0, 300, (500, 2000), 256, seed=21)
# 32 at once, twice, each ~30k real tokens with 512 to generate: 8-32k, the default pool.
FLOOD = [Arrival(at_s, ATTACKER, 30_500, 512) for at_s in (100.0, 180.0) for _ in range(32)]


def support_p99(flood: list[Arrival]) -> float:
    fleet = OfflineFleet(POLICY, seed=7, kv_capacity_tokens=CAPACITY)
    results = fleet.run(sorted(SUPPORT + flood, key=lambda a: a.at_s), until_s=330)
    ttfts = [r.ttft_s for r in results.values() if r.arrival.key is CRITICAL]
    assert len(ttfts) == len(SUPPORT) and all(t is not None for t in ttfts)
    return quantile([t for t in ttfts if t is not None], 0.99)


def test_a_counted_flood_does_not_move_the_critical_p99() -> None:
    quiet = support_p99([])
    flooded = support_p99(FLOOD)
    assert flooded <= 1.10 * quiet, (quiet, flooded)


def test_the_same_flood_counted_as_the_estimate_counted_it_hurts() -> None:
    """The control: counted at a tenth of their size, 32 fit the attacker's KV share where 3
    do, the engine fills behind admission's back and critical requests queue."""
    quiet = support_p99([])
    undercounted = [dataclasses.replace(a, counted_prompt_tokens=3_050) for a in FLOOD]
    assert support_p99(undercounted) > 2.0 * quiet
