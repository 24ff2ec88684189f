"""`slogate serve`: the sidecar alone, as production runs it; its arguments and handler.

What lives here: `register` (serve's parser, collected by tooling.cli.main with the other
subcommands), `serve_sidecar` (one sidecar process, extproc.runtime.serve, or N workers under
extproc.runtime.supervisor), `main` (`python -m extproc.runtime.serve_command`: how the
supervisor starts each worker), and the arguments the tools share with serve: --policy
(default: the shipped example), the admin address, --log-format / --log-level. Everything the
sidecar runs is imported inside the handler; nothing here imports the simulator or the tools.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from extproc.service.log_records import LOG_FORMATS
from extproc.shipped import example_policy
from policy._reader import PolicyError
from policy.loader import load_policy
from policy.schema import BudgetStoreKind

# The example policy inside the package, not a path relative to the working directory:
# `slogate up` run from anywhere finds it (an installed slogate its own copy, a checkout
# deploy/policy.example.yaml).
DEFAULT_POLICY = example_policy()
DEFAULT_ADMIN = "127.0.0.1:50052"
# --policy's default, as --help shows it. argparse passes a string default through `type`
# when the option is absent, which is where the example is looked up and the choice said.
_EXAMPLE_DEFAULT = "the example policy shipped with slogate"

log = logging.getLogger("slogate.cli")


def policy_path(value: str) -> Path:
    """--policy's value; without one, the shipped example, with a line saying which file:
    a stack started on the demo policy by mistake should not look like a configured one."""
    if value != _EXAMPLE_DEFAULT:
        return Path(value)
    log.info("no --policy given: using the example policy shipped with slogate, %s", DEFAULT_POLICY)
    return DEFAULT_POLICY


def policy_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        type=policy_path,
        default=_EXAMPLE_DEFAULT,
        help="policy YAML file (default: %(default)s, deploy/policy.example.yaml)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the sidecar alone (production mode)")
    serve_arguments(serve)


def serve_arguments(serve: argparse.ArgumentParser) -> None:
    policy_arg(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address of the gRPC port (and, by default, the others)"
    )
    serve.add_argument("--grpc-port", type=int, default=50051)
    serve.add_argument(
        "--grpc-socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="ext_proc and the access log on this Unix socket (mode 0660: the sidecar's user "
        "and group) instead of --host:--grpc-port; Envoy reaches it as a pipe address "
        "(`slogate envoy-config --sidecar-socket`). Not with --workers > 1",
    )
    serve.add_argument("--metrics-port", type=int, default=9464)
    serve.add_argument(
        "--metrics-host", default=None, help="address for /metrics (default: --host)"
    )
    serve.add_argument(
        "--admin-address",
        default=DEFAULT_ADMIN,
        help="admin API: host:port or unix:/path; 'none' turns it off",
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="PEM certificate chain: the gRPC port speaks TLS (a gateway calling slogate as "
        "its endpoint picker across the network); needs --tls-key",
    )
    serve.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    serve.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="PEM CA bundle: mutual TLS, only callers with a client certificate it signed",
    )
    serve.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="grpc.health.v1 alone on this port, in plain text (the kubelet's gRPC probe "
        "speaks no TLS, and dials the pod's address); default: on the gRPC port only",
    )
    serve.add_argument(
        "--health-host",
        default=None,
        help="address of --health-port (default: --host): 0.0.0.0 in a pod whose gRPC port "
        "stays on loopback or a Unix socket",
    )
    serve.add_argument(
        "--region",
        default=None,
        help="this deployment's region, one of the policy's regions.list (default: its "
        "regions.this): the same policy file can serve every region",
    )
    serve.add_argument(
        "--no-exact-tokenizer",
        action="store_true",
        help="never load the real tokenizer; decide on the fast estimate alone",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="sidecar processes sharing the gRPC port (SO_REUSEPORT); > 1 needs the Redis "
        "store. One /metrics (merged), one admin API (worker 0's)",
    )
    serve.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # set by --workers
    add_log_arguments(serve)
    serve.set_defaults(handler=serve_sidecar)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="json: one JSON object a line (ts, level, logger, message, request_id), for "
        "log pipelines",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="debug adds a line per decision (routed or refused, with its request id)",
    )


def listener_arguments(args: argparse.Namespace) -> tuple[str, ...]:
    """The gRPC listener's options (and the region) as serve's arguments, for each worker
    of --workers."""
    named = {
        "--tls-cert": args.tls_cert,
        "--tls-key": args.tls_key,
        "--tls-client-ca": args.tls_client_ca,
        "--health-port": args.health_port,
        "--health-host": args.health_host,
        "--region": args.region,
    }
    return tuple(part for flag, v in named.items() if v is not None for part in (flag, str(v)))


def serve_sidecar(args: argparse.Namespace) -> int:
    from extproc.runtime.grpc_servers import ListenerTls, PortTaken
    from extproc.runtime.serve import run_sidecar
    from extproc.runtime.workers import WorkerSlot
    from extproc.service.admin_auth import AdminTokenError
    from extproc.service.log_records import configure_logs
    from extproc.service.tracing import TracingUnavailable

    configure_logs(args.log_format, args.log_level)
    admin = None if args.admin_address == "none" else args.admin_address
    if args.workers < 1:
        print("slogate serve: --workers must be 1 or more", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("slogate serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.health_host is not None and args.health_port is None:
        print("slogate serve: --health-host needs --health-port", file=sys.stderr)
        return 2
    if args.grpc_socket is not None and args.workers > 1:
        # SO_REUSEPORT shares a TCP port between the workers; a Unix socket has one owner.
        print(
            "slogate serve: --grpc-socket takes one process: not with --workers > 1",
            file=sys.stderr,
        )
        return 2
    if args.tls_client_ca is not None and args.tls_cert is None:
        print("slogate serve: --tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    tls = None
    if args.tls_cert is not None:
        tls = ListenerTls(args.tls_cert, args.tls_key, args.tls_client_ca)
        unreadable = [str(f) for f in (tls.cert, tls.key, tls.client_ca) if f and not f.is_file()]
        if unreadable:
            print(f"slogate serve: no such file: {', '.join(unreadable)}", file=sys.stderr)
            return 2
    if args.region is not None:
        regions = load_policy(args.policy).regions
        if args.region not in regions.regions:
            known = ", ".join(sorted(regions.regions)) or "none: the policy has no regions:"
            print(
                f"slogate serve: --region {args.region!r} is not in the policy's "
                f"regions.list ({known})",
                file=sys.stderr,
            )
            return 2
    if args.workers > 1:
        if load_policy(args.policy).budget.store is BudgetStoreKind.MEMORY:
            print(
                "slogate serve: --workers > 1 needs budget.store: redis — with the in-process "
                "store each worker would keep its own budgets and KV ledger, and the limits "
                "would be multiplied by the workers",
                file=sys.stderr,
            )
            return 2
        from extproc.runtime.supervisor import run_workers

        return run_workers(
            args.workers,
            args.policy,
            args.host,
            args.grpc_port,
            args.metrics_port,
            args.metrics_host,
            admin,
            not args.no_exact_tokenizer,
            log_options=("--log-format", args.log_format, "--log-level", args.log_level),
            listener_options=listener_arguments(args),
        )
    slot = None
    if args.worker:
        index, count, base, directory = args.worker.split(",", 3)
        slot = WorkerSlot(int(index), int(count), base, Path(directory))
    try:
        asyncio.run(
            run_sidecar(
                args.policy,
                args.host,
                args.grpc_port,
                args.metrics_port,
                not args.no_exact_tokenizer,
                args.metrics_host,
                admin,
                worker=slot,
                tls=tls,
                health_port=args.health_port,
                grpc_socket=args.grpc_socket,
                health_host=args.health_host,
                region=args.region,
            )
        )
    except PortTaken as taken:  # one line naming the port, not a traceback
        print(f"slogate serve: {taken}", file=sys.stderr)
        return 2
    except (AdminTokenError, TracingUnavailable) as error:  # a token file, OpenTelemetry
        print(f"slogate serve: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """One worker of `slogate serve --workers N` (the supervisor's argv): serve's arguments
    alone, without the tools' command line around them."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(prog="slogate serve", description=__doc__)
    serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve_sidecar(args)
    except PolicyError as error:
        print(f"slogate: bad policy {args.policy}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
