"""Quotas ahead of a ramp, live: the arms `slogate loadtest --compare reactive,calendar,...`
plays one after the other, each a policy (and, for the wrong calendar, a workload) built
for the wall clock of its own run.

What lives here, pure (no I/O, the run's start passed in): `AHEAD_ARMS` (the arm names),
`ahead_policy` (an arm's policy: the workload's, with the planner's `ahead:` section or
without) and `ahead_document` (an arm's workload document: the ramp, or the same traffic
whose ramp never comes). The simulator's arms are sim.studies.ahead's; these are the same
study played against the live stack.

Time: the stack runs at `time_scale` (a workload second lasts `time_scale` real seconds),
but the sidecar's planner and controller run on the real clock. So every duration the
planner reads is scaled the same way: the one-off event `on:` the run's start plus the
ramp's start x scale, its duration, the lead and the grace x scale, and the controller's
interval (5 s of workload time, as the simulator steps it) x scale, in every arm, so the
reactive baseline steps at the same pace as the arms it is read against.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from typing import Any

from sim.fleet.workload_files import ramp_never_comes
from sim.studies.ahead import RAMP_CALENDAR

# The simulator's class-start calendar, in workload time: its lead, grace and multiple.
LEAD_MIN = RAMP_CALENDAR.lead_min
GRACE_MIN = RAMP_CALENDAR.grace_min
MULTIPLE = RAMP_CALENDAR.events[0].multiple
CONTROLLER_INTERVAL_S = 5.0  # the policy's default, in workload seconds

# name -> (declares the event, the ramp comes)
AHEAD_ARMS: dict[str, tuple[bool, bool]] = {
    "reactive": (False, True),
    "calendar": (True, True),
    "reactive-never": (False, False),
    "wrong-calendar": (True, False),
}


def ahead_policy(
    protected: Mapping[str, Any],
    document: Mapping[str, Any],
    arm: str,
    start_unix: float,
    time_scale: float,
) -> dict[str, Any]:
    """The arm's policy: `protected` (the workload's) with the controller stepping every
    5 workload seconds and, for the calendar arms, a one-off event in UTC at the wall time
    the workload's first burst starts in a run whose arrivals start at `start_unix`."""
    declares, _ = AHEAD_ARMS[arm]
    policy = copy.deepcopy(dict(protected))
    breaker = policy.setdefault("breaker", {})
    breaker["controller_interval_s"] = CONTROLLER_INTERVAL_S * time_scale
    policy.pop("ahead", None)
    if not declares:
        return policy
    ramp_start_s, ramp_end_s = (float(t) for t in document["bursts"][0])
    on = dt.datetime.fromtimestamp(start_unix + ramp_start_s * time_scale, dt.UTC)
    policy["ahead"] = {
        "lead_min": round(LEAD_MIN * time_scale, 6),
        "grace_min": round(GRACE_MIN * time_scale, 6),
        "timezone": "UTC",
        "calendar": [
            {
                "name": "class-start",
                "tenants": list(document["burst_tenants"]),
                # to the second: a scaled ramp starts between the wall clock's minutes
                "on": on.replace(tzinfo=None).isoformat(timespec="seconds"),
                "duration_min": round((ramp_end_s - ramp_start_s) / 60.0 * time_scale, 6),
                "multiple": MULTIPLE,
            }
        ],
    }
    return policy


def ahead_document(document: Mapping[str, Any], arm: str) -> dict[str, Any]:
    """The arm's workload: the document itself, or (the ramp never comes) the same traffic
    without its ramp, as the simulator's "ramp never comes" arms play it
    (sim.fleet.workload_files.ramp_never_comes)."""
    _, comes = AHEAD_ARMS[arm]
    return copy.deepcopy(dict(document)) if comes else ramp_never_comes(document)


# Each arm read against the reactive arm on the same traffic (same run).
BASELINE = {"calendar": "reactive", "wrong-calendar": "reactive-never"}


def ahead_table(runs: Mapping[str, Mapping[str, Any]], utilisation: Mapping[str, float]) -> str:
    """One row per arm: the simulator's columns (sim.studies.ahead.table) measured live;
    `utilisation`: each arm's default pool's busy share (predict.live_utilisation)."""
    lines = [
        "| arm | critical attainment | burst handling | utilisation | goodput tok/s "
        "| sheddable attainment | 5xx | goodput vs baseline | moves | started late s "
        "| load average |",
        "|" + " --- |" * 11,
    ]
    for arm, run in runs.items():
        tiers = run["tiers"]
        base = runs.get(BASELINE.get(arm, ""))
        goodput = run["all"]["goodput_tokens_per_s"]
        ratio = "baseline"
        if base is not None and base["all"]["goodput_tokens_per_s"]:
            ratio = f"{goodput / base['all']['goodput_tokens_per_s']:.3f}x"
        moves = run["signals"].get("ahead_moves") or {}
        errors = sum(
            n
            for status, n in run["all"]["statuses"].items()
            if status.split()[0] == "0" or int(status.split()[0]) >= 500
        )
        cells = (
            _cell(tiers["critical"].get("slo_attainment_of_all"), "{:.4f}"),
            _cell(run.get("burst_handling"), "{:.4f}"),
            _cell(utilisation.get(arm), "{:.4f}"),
            _cell(goodput, "{:.1f}"),
            _cell(tiers["sheddable"].get("slo_attainment_of_all"), "{:.4f}"),
            str(errors),
            ratio,
            ", ".join(f"{k} {v:.0f}" for k, v in sorted(moves.items())) or "-",
            _cell(run.get("started_late_s"), "{:.2f}"),
            " / ".join(f"{v:.1f}" for v in run.get("load_average", [])),
        )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
