"""`slogate workload fit --traffic DIR [--from T] [--to T] [--out FILE] [--bin-s S]`: a
workload file fitted to a traffic record (sim.fleet.workload_fit), for `slogate simulate
--workload FILE [--scale 2]` and `slogate loadtest --workload FILE`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from tooling.cli.common import add_time_window, read_record, time_window


class _Flow(list[Any]):
    """A list written in YAML's flow style: a shape's hundreds of points on a few lines."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, True)
)


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser("workload", help="workload files: fit one to a traffic record")
    actions = command.add_subparsers(dest="workload_action", required=True)
    fit = actions.add_parser(
        "fit",
        help="per tenant: arrival rate and its daily shape, prompt and output lengths, "
        "streamed share, burst windows",
    )
    fit.add_argument(
        "--traffic", type=Path, action="append", required=True, help="a record dir or file"
    )
    add_time_window(fit)
    fit.add_argument("--out", type=Path, default=Path("fitted.yaml"), help="the workload file")
    fit.add_argument("--name", default=None, help="the workload's name (default: --out's stem)")
    fit.add_argument(
        "--bin-s", type=float, default=300.0, help="the rate shape's bin (default 300 s)"
    )
    fit.add_argument(
        "--burst-factor",
        type=float,
        default=None,
        # sim.fleet.workload_fit's BURST_FACTOR, read there when the command runs: `slogate serve`
        # loads nothing of the simulator to build the command line.
        help="a bin over this many times the tenant's median rate is a burst (default 3)",
    )
    fit.set_defaults(handler=fit_workload_file)


def fit_workload_file(args: argparse.Namespace) -> int:
    from sim.fleet.workload_fit import BURST_FACTOR, fit_workload

    try:
        from_s, to_s = time_window(args)
    except ValueError as error:
        print(f"slogate workload fit: {error}", file=sys.stderr)
        return 2
    if args.bin_s <= 0:
        print("slogate workload fit: --bin-s must be positive", file=sys.stderr)
        return 2
    burst_factor = BURST_FACTOR if args.burst_factor is None else args.burst_factor
    read = read_record(args.traffic, from_s, to_s, "slogate workload fit")
    if read is None:
        return 2
    try:
        workload = fit_workload(
            read.entries, from_s, to_s, args.bin_s, burst_factor, args.name or args.out.stem
        )
    except ValueError as error:
        print(f"slogate workload fit: {error}", file=sys.stderr)
        return 2
    fitted = workload["fitted"]
    header = (
        f"# Fitted by slogate workload fit from {fitted['requests']} requests, "
        f"{fitted['from']} to {fitted['to']}.\n"
        "# Play it: slogate simulate --workload FILE [--scale 2]; slogate loadtest --workload "
        "FILE.\n# Limits are not in the record: add `limits:` per tenant to play them.\n"
    )
    for tenant in workload["tenants"]:
        for stream in tenant["streams"]:
            stream["shape"] = _Flow(stream["shape"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(workload, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=100)
    args.out.write_text(header + text, encoding="utf-8")
    for tenant in workload["tenants"]:
        stream = tenant["streams"][0]
        bursts = len(tenant.get("bursts", []))
        print(
            f"{tenant['tenant']} ({tenant['tier']}): {stream['rate_per_s']:g} req/s, prompt "
            f"p50 {stream['prompt_tokens'][10]}, streamed {stream['stream_share']:.0%}, "
            f"{bursts} burst window(s)"
        )
    print(f"wrote {args.out}")
    return 0
