"""`slogate` command line: serve, up, envoy-config, bench."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from extproc.version import VERSION
from policy import PolicyError
from tooling import (
    admin_cli,
    bench_cli,
    deploy_cli,
    loadtest_cli,
    offline_commands,
    policy_cli,
    preflight_cli,
    replay_cli,
    stack_cli,
    tenants_cli,
    workload_cli,
)
from tooling.admin_cli import cmd_admin
from tooling.cli_common import DEFAULT_ADMIN, DEFAULT_POLICY, Signalled
from tooling.deploy_cli import cmd_envoy_config, cmd_k8s
from tooling.loadtest_cli import cmd_loadtest
from tooling.stack_cli import cmd_engine, cmd_serve, cmd_up

__all__ = [
    "DEFAULT_ADMIN",
    "DEFAULT_POLICY",
    "Signalled",
    "build_parser",
    "cmd_admin",
    "cmd_engine",
    "cmd_envoy_config",
    "cmd_k8s",
    "cmd_loadtest",
    "cmd_serve",
    "cmd_up",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slogate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"slogate {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    # The subcommands in the order `slogate --help` has always listed them.
    stack_cli.add_serve_command(sub)  # serve: the sidecar alone
    deploy_cli.add_envoy_config_command(sub)  # envoy-config: bootstrap or fragment
    stack_cli.add_up_command(sub)  # up: the local stack
    stack_cli.add_engine_command(sub)  # engine vllm: a real engine on loopback
    deploy_cli.add_k8s_command(sub)  # k8s: manifests, or a mesh's
    admin_cli.add_admin_commands(sub)  # status / keys / reload / drill / drain
    tenants_cli.add_tenants_command(sub, DEFAULT_ADMIN)  # tenants: class, tier, spend
    policy_cli.add_policy_command(sub, DEFAULT_ADMIN)  # policy diff / promote
    bench_cli.add_simulate_command(sub)  # simulate: the offline fleet
    replay_cli.add_replay_command(sub)  # replay: a traffic record under a policy
    workload_cli.add_workload_command(sub)  # workload fit: a workload from a record
    loadtest_cli.add_loadtest_command(sub)  # loadtest: a workload against a live stack
    preflight_cli.add_preflight_command(sub)  # preflight: the field's checklists, live
    bench_cli.add_calibrate_command(sub)  # calibrate: endpoints' latency model
    bench_cli.add_bench_command(sub)  # bench overhead / decision-cost / ...
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    handlers = {
        "serve": cmd_serve,
        "envoy-config": cmd_envoy_config,
        "up": cmd_up,
        "engine": cmd_engine,
        "loadtest": cmd_loadtest,
        "status": cmd_admin,
        "keys": admin_cli.cmd_keys,
        "reload": cmd_admin,
        "drill": cmd_admin,
        "drain": cmd_admin,
        "tenants": tenants_cli.cmd_tenants,
        "policy": policy_cli.cmd_policy,
        "k8s": cmd_k8s,
        "simulate": offline_commands.cmd_simulate,
        "replay": replay_cli.cmd_replay,
        "workload": workload_cli.cmd_workload,
        "calibrate": offline_commands.cmd_calibrate,
        "bench": offline_commands.cmd_bench,
        "preflight": preflight_cli.cmd_preflight,
    }
    try:
        return handlers[args.command](args)
    except PolicyError as error:
        print(f"slogate: bad policy {args.policy}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `slogate status | head`: the reader left. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again, and exit as a piped command does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
