"""`slogate replay --traffic DIR --policy P [--from T] [--to T]`: recorded traffic replayed
through the admission chain on a virtual clock (sim.fleet.replay), with the agreement check."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tooling.cli.common import add_time_window, read_record, time_window

if TYPE_CHECKING:
    from sim.server.model import LatencyConfig


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "replay",
        help="replay a traffic record (policy traffic_record:, `up --record`) under a policy",
    )
    command.add_argument(
        "--traffic", type=Path, action="append", required=True, help="a record dir or file"
    )
    command.add_argument("--policy", type=Path, required=True, help="the policy to replay under")
    add_time_window(command)
    command.add_argument("--seed", type=int, default=1)
    command.add_argument(
        "--latency-from",
        type=Path,
        default=None,
        help="a policy with a latency_model section (slogate calibrate) for the engines",
    )
    command.add_argument("--out", type=Path, default=None, help="default bench/results/replay")
    command.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        help="exit 1 when fewer admission outcomes than this share match the record",
    )
    command.set_defaults(handler=run_replay)


def _latency(path: Path | None) -> LatencyConfig | None:
    if path is None:
        return None
    from policy.loader import load_policy
    from sim.server.calibration import latency_config

    measured = load_policy(path)
    fit = measured.latency_models.get(measured.default_pool)
    if fit is None:
        raise ValueError(f"{path} has no latency_model for its default pool")
    return latency_config(fit, measured.buckets)


def run_replay(args: argparse.Namespace) -> int:
    from policy.loader import load_policy
    from sim.fleet.replay import replay, replay_table

    try:
        from_s, to_s = time_window(args)
        latency = _latency(args.latency_from)
    except ValueError as error:
        print(f"slogate replay: {error}", file=sys.stderr)
        return 2
    policy = load_policy(args.policy)
    read = read_record(args.traffic, from_s, to_s, "slogate replay")
    if read is None:
        return 2
    report = replay(read.entries, policy, seed=args.seed, latency=latency)
    report["files"] = [str(path) for path in read.files]
    report["problems"] = read.problems
    out: Path = args.out or Path("bench/results/replay")
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    text = replay_table(report)
    md_path.write_text(f"# slogate replay --policy {args.policy}\n\n{text}\n")
    print(text)
    print(f"wrote {json_path} and {md_path}")
    share = report["agreement"]["agreement"]
    if args.min_agreement is not None and (share is None or share < args.min_agreement):
        print(f"slogate replay: agreement {share} is under {args.min_agreement}", file=sys.stderr)
        return 1
    return 0
