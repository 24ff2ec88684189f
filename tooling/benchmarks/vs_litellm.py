"""slogate against LiteLLM's proxy in `slogate bench overhead`: the arithmetic, no I/O.

The zero for both is `upstream_direct` (wrk straight to the upstream Envoy): a gateway's
p50 overhead is its p50 at one connection minus that one's, since LiteLLM has no Envoy in
front and Envoy alone would charge slogate for a hop LiteLLM does not make. Throughput per
core: requests per CPU second of the gateway's own processes at 16 connections, 1e6 over
the sum of their CPU µs per request (slogate: sidecar and its Envoy; LiteLLM: its tree),
which does not depend on how many cores this machine lent each one during the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Row = Mapping[str, float]
BASELINE = "upstream_direct"
# Each LiteLLM arm against the slogate arm whose limits live in the same kind of store.
PAIRS = {"litellm": "slogate", "litellm_redis": "slogate_redis"}


def per_core(row: Row) -> float | None:
    """Requests per CPU second of the gateway's processes; None when none were timed."""
    used = sum(v for k, v in row.items() if k.startswith("cpu_us_per_request_"))
    return 1e6 / used if used > 0 else None


def verdicts(setups: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
    """Per LiteLLM arm present: both p50 overheads, both throughputs per core, and whether
    slogate is ahead on each (the target: ahead on both)."""
    zero = setups.get(BASELINE)
    out: dict[str, dict[str, Any]] = {}
    for arm, ours_name in PAIRS.items():
        if arm not in setups or ours_name not in setups or zero is None:
            continue
        theirs, ours = setups[arm], setups[ours_name]
        ours_core, theirs_core = per_core(ours), per_core(theirs)
        p50_ours = ours["p50_ms"] - zero["p50_ms"]
        p50_theirs = theirs["p50_ms"] - zero["p50_ms"]
        ahead_p50 = p50_ours < p50_theirs
        ahead_core = ours_core is not None and theirs_core is not None and ours_core > theirs_core
        out[arm] = {
            "slogate_arm": ours_name,
            "p50_overhead_ms_slogate": round(p50_ours, 3),
            "p50_overhead_ms_litellm": round(p50_theirs, 3),
            "rps_per_core_slogate": None if ours_core is None else round(ours_core, 1),
            "rps_per_core_litellm": None if theirs_core is None else round(theirs_core, 1),
            "rps_16_slogate": round(ours["rps_16"], 1),
            "rps_16_litellm": round(theirs["rps_16"], 1),
            "ahead_p50": ahead_p50,
            "ahead_per_core": ahead_core,
            "met": ahead_p50 and ahead_core,
        }
    return out


def lines(all_verdicts: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """One line per profile and LiteLLM arm, for the report."""
    out = []
    for profile, arms in all_verdicts.items():
        for arm, v in arms.items():
            cores = f"{v['rps_per_core_slogate']} vs {v['rps_per_core_litellm']} req/s per core"
            out.append(
                f"- {profile}: {v.get('slogate_arm', 'slogate')} vs {arm}: p50 overhead "
                f"{v['p50_overhead_ms_slogate']:+.3f} ms vs "
                f"{v['p50_overhead_ms_litellm']:+.3f} ms "
                f"({'ahead' if v['ahead_p50'] else 'behind'}); {cores} "
                f"({'ahead' if v['ahead_per_core'] else 'behind'}); "
                f"{v['rps_16_slogate']:.0f} vs {v['rps_16_litellm']:.0f} req/s at 16 conn: "
                f"{'met' if v['met'] else 'not met'}"
            )
    return "\n".join(out)
