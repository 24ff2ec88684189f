"""`slogate fuzz`: the sidecar fuzzed at its door for a while (tooling.fuzz), in this
process; how many inputs it tried and what it found."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from extproc.runtime.serve_command import policy_arg


def register(sub: argparse._SubParsersAction) -> None:
    fuzz = sub.add_parser(
        "fuzz", help="fuzz a sidecar's gRPC port (ext_proc and access log); report findings"
    )
    policy_arg(fuzz)
    fuzz.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    fuzz.add_argument("--seed", type=int, default=0, help="the first batch's seed")
    fuzz.add_argument("--batch", type=int, default=60, help="ext_proc streams per batch")
    fuzz.add_argument(
        "--crowded",
        action="store_true",
        help="each pool one batch slot, held through every case: requests wait in the room",
    )
    fuzz.add_argument(
        "--out", type=Path, default=None, help="JSON report (the first case of each finding)"
    )
    fuzz.set_defaults(handler=run_fuzz)


def run_fuzz(args: argparse.Namespace) -> int:
    try:
        from tooling.fuzz.campaign import campaign, fuzz_policy
    except ImportError as error:  # hypothesis comes with the test extra
        print(f"slogate fuzz needs the test extra (pip install 'slogate[test]'): {error}")
        return 2
    # grpc logs each message it cannot parse (most mutated ones): expected here, and a
    # servicer's own exception still shows, as the stream's status the fuzzer checks.
    logging.getLogger("grpc._cython.cygrpc").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="slogate-fuzz-") as scratch:
        policy = fuzz_policy(args.policy, Path(scratch), args.crowded)
        report = campaign(
            policy,
            args.seconds,
            args.seed,
            args.batch,
            progress=lambda line: print(line, file=sys.stderr),
            crowded=args.crowded,
        )
    print("\n".join(report.lines()))
    if args.out is not None:
        args.out.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    return 1 if report.counts else 0
