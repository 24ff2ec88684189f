"""`slogate preflight`: its arguments and its exit status (tooling.preflight.run runs it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from extproc.runtime.serve_command import DEFAULT_ADMIN
from policy.domain import Tier
from tooling.cli.common import add_token_file


def register(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "preflight",
        help="the field's checklists against a running deployment (exit 1 on a failure)",
    )
    command.add_argument("--url", required=True, help="the gateway, e.g. http://host:10000")
    command.add_argument("--prometheus", required=True, help="the Prometheus scraping slogate")
    command.add_argument("--admin", default=DEFAULT_ADMIN, help="the sidecar's admin API")
    add_token_file(command)  # the drills change the breaker: they need the admin token
    command.add_argument("--policy", type=Path, help="policy file: zones, model, demo keys")
    command.add_argument(
        "--zones", type=Path, help="engine -> zone YAML, or `kubectl get pods,nodes -o json`"
    )
    command.add_argument("--probes", type=int, default=10, help="probe requests per engine")
    command.add_argument(
        "--drills", action="store_true", help="drill a pool to L3 and back (changes it live)"
    )
    command.add_argument(
        "--drill-pool",
        help="the pool drilled (default: the routing default, where its short requests go)",
    )
    command.add_argument("--model", help="the model the drills' requests name")
    command.add_argument(
        "--drill-streams", type=int, default=4, help="streamed requests held through the drill"
    )
    command.add_argument(
        "--drill-stream-tokens", type=int, default=1024, help="each held stream's max_tokens"
    )
    command.add_argument(
        "--key", action="append", default=[], metavar="TIER=KEY", help="a key per tier"
    )
    command.add_argument("--strict", action="store_true", help="cannot-check fails too")
    command.add_argument("--json", action="store_true", help="print JSON, not lines")
    command.set_defaults(handler=run_preflight)


def run_preflight(args: argparse.Namespace) -> int:
    from tooling.preflight.checks import exit_code
    from tooling.preflight.run import PreflightOptions, clear_keys, report, run

    keys = clear_keys(args.policy) if args.policy else {}
    for pair in args.key:
        tier, _, key = pair.partition("=")
        if tier not in {t.value for t in Tier} or not key:
            print(f"slogate preflight: --key {pair!r}: expected TIER=KEY", file=sys.stderr)
            return 2
        keys[Tier(tier)] = key
    options = PreflightOptions(
        url=args.url,
        prometheus=args.prometheus,
        admin=args.admin,
        token_file=args.token_file,
        policy_path=args.policy,
        zones_path=args.zones,
        probe_rounds=args.probes,
        drills=args.drills,
        drill_pool=args.drill_pool,
        model=args.model,
        keys=keys,
        drill_streams=args.drill_streams,
        drill_stream_tokens=args.drill_stream_tokens,
    )
    try:
        results = run(options)
    except (OSError, ValueError, yaml.YAMLError) as error:  # the zones file's
        print(f"slogate preflight: {error}", file=sys.stderr)
        return 2
    print(report(results, args.json))
    return exit_code(results, args.strict)
