"""`slogate`: protect an LLM inference fleet behind Envoy.

Run it: serve (the sidecar alone), envoy-config (the Envoy bootstrap, or a fragment for an
Envoy of yours), up (the local stack: pools, sidecar, Envoy), engine (a real vLLM on
loopback), k8s (Kubernetes and mesh manifests). Operate it: status, keys, reload, drill,
drain, tenants, policy (diff / promote). Study it: simulate (the offline fleet), replay (a
traffic record under a policy), workload (fit one to a record), loadtest (a workload against
a live stack), preflight (the field's checklists, live), calibrate (endpoints' latency
model), bench (the benchmarks), fuzz (the sidecar's gRPC port).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from extproc.runtime import serve_command
from extproc.version import VERSION
from policy._reader import PolicyError
from tooling.cli import (
    admin,
    bench,
    calibrate,
    engine,
    envoy_config,
    forecast,
    fuzz,
    k8s,
    loadtest,
    policy,
    preflight,
    replay,
    simulate,
    tenants,
    up,
    workload,
)

# One module per subcommand (vLLM's entrypoints/cli): each registers its parser and, with
# set_defaults(handler=...), the function that runs it, so the two cannot drift apart.
# Listed in the order `slogate --help` has always shown them; each imports what its handler
# needs inside the handler, so `slogate serve` loads nothing of the simulator or the tools.
COMMANDS = (
    serve_command,  # serve: the sidecar alone
    envoy_config,  # envoy-config: bootstrap or fragment
    up,  # up: the local stack
    engine,  # engine vllm: a real engine on loopback
    k8s,  # k8s: manifests, or a mesh's
    admin,  # status / keys (tooling.cli.keys) / reload / drill / drain
    tenants,  # tenants: class, tier, spend
    policy,  # policy diff / promote
    simulate,  # simulate: the offline fleet
    replay,  # replay: a traffic record under a policy
    workload,  # workload fit: a workload from a record
    forecast,  # forecast: each tenant's seasonal forecast from a record, its error
    loadtest,  # loadtest: a workload against a live stack
    preflight,  # preflight: the field's checklists, live
    calibrate,  # calibrate: endpoints' latency model
    bench,  # bench overhead / decision-cost / ...
    fuzz,  # fuzz: the sidecar's gRPC port, ext_proc and access log
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slogate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"slogate {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
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
