"""Workloads from files: what a YAML file under sim/workloads/ says, drawn into arrivals.

What lives here: `Workload`, `load_workload` / `workload_from` (a workload document -> the
policy its tenants' keys make and their Poisson arrivals), `workload_policy` /
`policy_document` (that policy as data), `workload_path` (a name on the command line -> its
file), `ramp_never_comes` (a document without its ramp) and `SIMULATION_POLICY`, the
breaker timings the offline comparisons run under.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policy.loader import parse_policy
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, poisson_arrivals

WORKLOADS = Path(__file__).parent.parent / "workloads"  # sim/workloads/: data of the package sim

# The breaker timings used in the offline comparisons: seconds-scale windows, so that a
# 5-15 minute workload sees the breaker and the controller act.
SIMULATION_POLICY = {
    # P99 TTFT SLOs the simulated engines can meet at empty load: their P99 for a 20-32k
    # prompt is ~4-5 s (the field's tail), so a 2 s SLO there would be failed by design.
    "slos": {
        "critical": {"default": 2000, "8-32k": 6000, "32k-128k": 15000},
        "standard": {"default": 4000, "8-32k": 12000, "32k-128k": 30000},
        "sheddable": {"default": 15000, "8-32k": 30000, "32k-128k": 60000},
    },
    "breaker": {
        "window_s": 30,
        "controller_interval_s": 2,
        "scrape_interval_s": 1,
        "thresholds": {"enter_hold_s": [5, 5, 5], "cooldown_s": 30, "probe_hold_s": 15},
    },
}


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    duration_s: float
    policy: Policy
    arrivals: list[Arrival]
    bursts: list[tuple[float, float]]
    # Whose requests count as the burst; empty: everyone's inside the burst windows.
    burst_tenants: frozenset[str] = frozenset()

    def first(self, seconds: float) -> Workload:
        """The workload's first `seconds` (a quick look: `--duration-s`)."""
        return dataclasses.replace(
            self,
            arrivals=[a for a in self.arrivals if a.at_s < seconds],
            duration_s=min(self.duration_s, seconds),
        )


def workload_policy(path: Path, base_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The policy a workload runs under, as data: `base_policy` plus a key `sk-<tenant>` per
    tenant with its limits (what `slogate loadtest` gives a live stack too)."""
    return policy_document(yaml.safe_load(path.read_text(encoding="utf-8")), base_policy)


def policy_document(
    raw: dict[str, Any], base_policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`workload_policy` for a workload document already read."""
    policy_raw = dict(base_policy or {})
    policy_raw["keys"] = [
        {
            "key": f"sk-{t['tenant']}",
            "tenant": t["tenant"],
            "tier": t["tier"],
            "limits": t.get("limits", {}),
        }
        for t in raw["tenants"]
    ]
    return policy_raw


def load_workload(
    path: Path, base_policy: dict[str, Any] | None = None, seed: int = 1, scale: float = 1.0
) -> Workload:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return workload_from(raw, base_policy, seed, source=str(path), scale=scale)


def workload_path(name: str) -> Path:
    """A workload named on the command line: a file (a path, or any name ending in .yaml:
    e.g. one `slogate workload fit` wrote), else a name in sim/workloads/."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    return WORKLOADS / f"{name}.yaml"


def ramp_never_comes(document: Mapping[str, Any]) -> dict[str, Any]:
    """The same workload with its ramp taken out: the burst tenants' shaped streams held at
    their first level for the whole run (same tenants, seed and bursts window), what a
    forecast or a declared event that expects the ramp is measured against when it is wrong."""
    raw = copy.deepcopy(dict(document))
    duration_s = float(raw["duration_s"])
    for tenant in raw["tenants"]:
        if tenant["tenant"] not in raw["burst_tenants"]:
            continue
        for stream in tenant["streams"]:
            if "shape" in stream:
                first = float(stream["shape"][0][1])
                stream["shape"] = [[0, first], [duration_s, first]]
    return raw


def workload_from(
    raw: dict[str, Any],
    base_policy: dict[str, Any] | None = None,
    seed: int = 1,
    source: str = "",
    scale: float = 1.0,
) -> Workload:
    """`load_workload` for a workload document already read (e.g. with its rates scaled).
    `scale` multiplies every stream's arrival rate (`slogate simulate --scale 2`)."""
    duration_s = float(raw["duration_s"])
    policy = parse_policy(policy_document(raw, base_policy), source=source)
    arrivals: list[Arrival] = []
    for t_index, tenant in enumerate(raw["tenants"]):
        key = policy.key_for(f"sk-{tenant['tenant']}")
        assert key is not None
        for s_index, stream in enumerate(tenant["streams"]):
            # [low, high] (uniform), or a longer quantile table (sim.fleet.arrivals).
            prompt_tokens = [int(v) for v in stream["prompt_tokens"]]
            if len(prompt_tokens) < 2:
                raise ValueError(f"{source}: prompt_tokens needs [low, high] or a quantile table")
            arrivals += poisson_arrivals(
                key,
                float(stream["rate_per_s"]) * scale,
                float(stream.get("start_s", 0.0)),
                float(stream.get("end_s", duration_s)),
                prompt_tokens,
                int(stream["max_tokens"]),
                seed=seed * 1000 + t_index * 10 + s_index,
                shape=[(float(t), float(f)) for t, f in stream.get("shape", [])],
                stream_share=float(stream.get("stream_share", raw.get("stream_share", 1.0))),
                crafted=bool(stream.get("crafted", False)),
                output_tokens=[int(v) for v in stream.get("output_tokens", [])],
            )
    arrivals.sort(key=lambda a: a.at_s)
    bursts = [(float(a), float(b)) for a, b in raw.get("bursts", [])]
    burst_tenants = frozenset(str(t) for t in raw.get("burst_tenants", []))
    return Workload(raw["name"], duration_s, policy, arrivals, bursts, burst_tenants)
