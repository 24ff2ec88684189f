"""`slogate policy diff OLD NEW --traffic DIR`: a traffic record replayed under both policies
(sim.fleet.replay, the same entries and seed), compared per tenant and tier
(sim.studies.policy_impact),
with the guards a CI pipeline holds a change to.

What lives here: the command's arguments and its run: read the record, replay it twice,
print the schema differences (policy.diff) then the changes (Markdown), write `--out` as
.md and .json. Exit 0 when every guard holds, 1 when one trips (each printed: which
tenant, what, how much), 2 for a policy or record that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tooling.cli.common import add_time_window, read_record, time_window


def add_traffic_arguments(diff: argparse.ArgumentParser) -> None:
    diff.add_argument(
        "--traffic",
        type=Path,
        action="append",
        default=None,
        help="a traffic record dir or file (repeatable), replayed under both policies",
    )
    add_time_window(diff)
    diff.add_argument("--seed", type=int, default=1, help="the same for both replays")
    diff.add_argument("--out", type=Path, default=None, help="also write OUT.md and OUT.json")
    diff.add_argument(
        "--simulated-timing",
        action="store_true",
        help="admitted requests take the simulated engines' time, not their recorded one "
        "(for changes to pools or routing, whose effect on latency the record cannot show)",
    )
    diff.add_argument(
        "--max-critical-loss",
        type=float,
        default=0.01,
        help="exit 1 when a tenant with critical traffic loses more than this share of its "
        "admitted requests (default 0.01)",
    )
    diff.add_argument(
        "--max-p99-growth",
        type=float,
        default=0.20,
        help="exit 1 when a tenant's P99 TTFT (per tier) grows more than this (default 0.20)",
    )


def traffic_diff(args: argparse.Namespace) -> int:
    from policy._reader import PolicyError
    from policy.diff import policy_changes
    from policy.loader import load_policy
    from sim.fleet.replay import replayed_requests
    from sim.studies.policy_impact import Guards, check_guards, compare, impact_markdown

    name = "slogate policy diff"
    try:
        from_s, to_s = time_window(args)
        old, new = load_policy(args.old), load_policy(args.new)
    except (PolicyError, OSError, ValueError) as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 2
    read = read_record(args.traffic, from_s, to_s, name)
    if read is None:
        return 2
    guards = Guards(args.max_critical_loss, args.max_p99_growth)
    timing = not args.simulated_timing
    before = replayed_requests(read.entries, old, seed=args.seed, recorded_timing=timing)
    after = replayed_requests(read.entries, new, seed=args.seed, recorded_timing=timing)
    rows = compare(before, after)
    tripped = check_guards(rows, guards)
    schema = policy_changes(old, new)
    lines = [f"## Policy changes: `{args.old}` → `{args.new}`", ""]
    lines += [f"- {sentence}" for sentence in schema] or ["No setting differs."]
    lines += [
        "",
        f"### On recorded traffic: {len(read.entries)} requests, {before.duration_s:g} s "
        f"(replayed under both, seed {args.seed})",
        "",
        impact_markdown(rows, tripped, guards),
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        report: dict[str, Any] = {
            "old": str(args.old),
            "new": str(args.new),
            "schema": schema,
            "traffic": {
                "files": [str(path) for path in read.files],
                "problems": read.problems,
                "requests": len(read.entries),
                "duration_s": before.duration_s,
                "seed": args.seed,
                "recorded_timing": timing,
            },
            "guards": {
                "max_critical_loss": guards.max_critical_loss,
                "max_p99_growth": guards.max_p99_growth,
                "tripped": tripped,
            },
            "rows": rows,
        }
        out: Path = args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    for guard in tripped:
        print(f"{name}: guard tripped: {guard['message']}", file=sys.stderr)
    return 1 if tripped else 0
