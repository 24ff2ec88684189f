"""`slogate envoy-config`: the Envoy bootstrap for a policy, or the fragment slogate adds to
an Envoy of yours (tooling.render.envoy_config renders them)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from extproc.runtime.serve_command import policy_arg
from tooling.cli.common import pool_cluster


def register(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("envoy-config", help="write the Envoy bootstrap for a policy")
    policy_arg(config)
    config.add_argument("--out", type=Path, default=Path("envoy/bootstrap.json"))
    config.add_argument("--listen-port", type=int, default=10000)
    config.add_argument("--admin-port", type=int, default=9901)
    config.add_argument("--sidecar-port", type=int, default=50051)
    config.add_argument("--host", default="127.0.0.1")
    config.add_argument(
        "--sidecar-socket",
        default=None,
        metavar="PATH",
        help="reach the sidecar at this Unix socket (`serve --grpc-socket`) instead of "
        "--host:--sidecar-port",
    )
    config.add_argument(
        "--fragment",
        action="store_true",
        help="only what slogate adds (filters, clusters, access log, pool routes, per-route "
        "and manager settings), for merging into an Envoy configuration of your own",
    )
    config.add_argument(
        "--merge-into",
        type=Path,
        default=None,
        metavar="BOOTSTRAP",
        help="your static bootstrap (YAML or JSON): write it with the fragment merged in",
    )
    config.add_argument("--listener", default=None, help="with --merge-into: only this one")
    config.add_argument(
        "--contract",
        action="store_true",
        help="print what slogate needs from an Envoy (the docs' contract table) and exit",
    )
    config.add_argument(
        "--pool-cluster",
        type=pool_cluster,
        action="append",
        default=[],
        metavar="POOL=CLUSTER",
        help="with --fragment/--merge-into: the cluster of yours a pool's engines are behind",
    )
    config.add_argument(
        "--sidecar-tls-ca",
        default=None,
        metavar="FILE",
        help="TLS to the sidecar (`serve --tls-cert`): the CA its certificate chains to",
    )
    config.add_argument(
        "--sidecar-tls-name",
        default=None,
        help="with --sidecar-tls-ca: the name the sidecar's certificate carries (and SNI)",
    )
    config.add_argument(
        "--sidecar-tls-cert",
        default=None,
        metavar="FILE",
        help="with --sidecar-tls-ca: Envoy's client certificate (mutual TLS); needs "
        "--sidecar-tls-key",
    )
    config.add_argument("--sidecar-tls-key", default=None, metavar="FILE")
    config.add_argument(
        "--region",
        default=None,
        help="the region this Envoy serves, as `serve --region` (default: the policy's "
        "regions.this): its peers get a cluster and a route each where crossing is on",
    )
    config.set_defaults(handler=write_config)


def write_config(args: argparse.Namespace) -> int:
    import yaml

    from policy.loader import load_policy
    from tooling.render.envoy_config.bootstrap import build_bootstrap
    from tooling.render.envoy_config.fragment import (
        FragmentTarget,
        MergeError,
        build_fragment,
        merge_fragment,
    )
    from tooling.render.envoy_config.profile import EnvoyPorts, SidecarTls

    if args.contract:
        from tooling.render.envoy_config.fragment import contract_table

        print(contract_table())
        return 0
    sidecar_tls = None
    client = (args.sidecar_tls_cert, args.sidecar_tls_key)
    if args.sidecar_tls_ca is None and (args.sidecar_tls_name or any(client)):
        print(
            "slogate envoy-config: the --sidecar-tls-* options need --sidecar-tls-ca",
            file=sys.stderr,
        )
        return 2
    if any(client) and not all(client):
        print(
            "slogate envoy-config: --sidecar-tls-cert and --sidecar-tls-key go together",
            file=sys.stderr,
        )
        return 2
    if args.sidecar_tls_ca is not None:
        sidecar_tls = SidecarTls(args.sidecar_tls_ca, args.sidecar_tls_name, *client)
    policy = load_policy(args.policy)
    if args.region is not None:
        if args.region not in policy.regions.regions:
            print(
                f"slogate envoy-config: --region {args.region!r} is not in the policy's "
                "regions.list",
                file=sys.stderr,
            )
            return 2
        regions = dataclasses.replace(policy.regions, this=args.region)
        policy = dataclasses.replace(policy, regions=regions)
    ports = EnvoyPorts(
        args.listen_port,
        args.admin_port,
        args.sidecar_port,
        args.host,
        sidecar_tls=sidecar_tls,
        sidecar_socket=args.sidecar_socket,
    )
    target = FragmentTarget(
        args.host, args.sidecar_port, dict(args.pool_cluster), sidecar_tls, args.sidecar_socket
    )
    notes: list[str] = []
    if args.merge_into is not None:
        theirs = yaml.safe_load(args.merge_into.read_text(encoding="utf-8"))
        try:
            config, notes = merge_fragment(theirs, build_fragment(policy, target), args.listener)
        except MergeError as error:
            where = f"slogate envoy-config: cannot merge into {args.merge_into}"
            print(f"{where}: {error}", file=sys.stderr)
            return 2
    elif args.fragment:
        config = build_fragment(policy, target)
    else:
        config = build_bootstrap(policy, ports)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix in (".yaml", ".yml"):
        args.out.write_text(yaml.safe_dump(config, sort_keys=False))
    else:
        args.out.write_text(json.dumps(config, indent=1) + "\n")
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out}")
    return 0
