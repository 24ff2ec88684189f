"""`slogate calibrate`: measure OpenAI-compatible endpoints and write their latency model
(tooling.loadtest.calibrate does the measuring)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from extproc.runtime.serve_command import policy_arg


def register(sub: argparse._SubParsersAction) -> None:
    calibrate = sub.add_parser(
        "calibrate", help="measure OpenAI-compatible endpoints; write their latency model"
    )
    calibrate.add_argument(
        "--url",
        action="append",
        required=True,
        help="[POOL=]URL of an endpoint (repeat for several pools; default pool name: default)",
    )
    policy_arg(calibrate)
    calibrate.add_argument("--model", default=None, help="model name (default: the policy's)")
    calibrate.add_argument("--api-key", default=None, help="Bearer key, e.g. through slogate")
    calibrate.add_argument("--requests", type=int, default=100, help="tiny requests per pool")
    calibrate.add_argument("--per-size", type=int, default=20, help="requests per probe size")
    calibrate.add_argument("--max-context", type=int, default=32_768)
    calibrate.add_argument("--out", type=Path, default=None, help="write the YAML here too")
    calibrate.set_defaults(handler=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    import aiohttp

    from policy.loader import load_policy
    from tooling.loadtest.calibrate import CalibrationError, Measurement, measure, report

    if args.requests < 1 or args.per_size < 1 or args.max_context < 512:
        print(
            "slogate calibrate: --requests and --per-size must be >= 1, --max-context >= 512",
            file=sys.stderr,
        )
        return 2
    policy = load_policy(args.policy)
    targets = []
    for index, value in enumerate(args.url):
        name, sep, url = value.partition("=")
        if not sep or "://" in name:
            name, url = ("default" if index == 0 else f"pool{index + 1}"), value
        targets.append((name, url))

    async def run() -> list[Measurement]:
        return [
            await measure(
                name,
                url,
                args.model or policy.model_name,
                policy.buckets,
                tiny_count=args.requests,
                per_size=args.per_size,
                max_context=args.max_context,
                api_key=args.api_key,
            )
            for name, url in targets
        ]

    try:
        measurements = asyncio.run(run())
    except (CalibrationError, OSError, TimeoutError, aiohttp.ClientError, ValueError) as error:
        print(f"slogate calibrate: {error}", file=sys.stderr)
        return 1
    text = report(measurements, policy.buckets)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
        print(f"# wrote {args.out}")
    return 0
