"""`slogate envoy-config` and `slogate k8s`: the Envoy bootstrap (or the fragment slogate
adds to an Envoy of yours) and the Kubernetes manifests for a policy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from policy import load_policy
from tooling.cli_common import policy_arg


def _pool_cluster(value: str) -> tuple[str, str]:
    name, _, cluster = value.partition("=")
    if not name or not cluster:
        raise argparse.ArgumentTypeError(f"expected POOL=CLUSTER, got {value!r}")
    return name, cluster


def _pool_service(value: str) -> tuple[str, tuple[str, int]]:
    name, _, address = value.partition("=")
    service, _, port = address.rpartition(":")
    if not name or not service or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected POOL=SERVICE:PORT, got {value!r}")
    return name, (service, int(port))


def _label(value: str) -> tuple[str, str]:
    key, _, label = value.partition("=")
    if not key or not label:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, label


def add_envoy_config_command(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("envoy-config", help="write the Envoy bootstrap for a policy")
    policy_arg(config)
    config.add_argument("--out", type=Path, default=Path("envoy/bootstrap.json"))
    config.add_argument("--listen-port", type=int, default=10000)
    config.add_argument("--admin-port", type=int, default=9901)
    config.add_argument("--sidecar-port", type=int, default=50051)
    config.add_argument("--host", default="127.0.0.1")
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
        type=_pool_cluster,
        action="append",
        default=[],
        metavar="POOL=CLUSTER",
        help="with --fragment/--merge-into: the cluster of yours a pool's engines are behind",
    )


def add_k8s_command(sub: argparse._SubParsersAction) -> None:
    k8s = sub.add_parser("k8s", help="write Kubernetes manifests (Envoy + sidecar pod)")
    policy_arg(k8s)
    k8s.add_argument("--out", type=Path, default=None, help="default deploy/k8s/slogate*.yaml")
    k8s.add_argument(
        "--mesh",
        choices=("istio", "envoy-gateway"),
        default=None,
        help="slogate for a mesh's Envoys (an EnvoyFilter; Envoy Gateway's policies) instead "
        "of a pod with its own Envoy",
    )
    k8s.add_argument(
        "--image",
        default=None,
        help="the sidecar's image (default ghcr.io/slogate/slogate:<this version>)",
    )
    k8s.add_argument("--replicas", type=int, default=2, help="the Deployment's replicas")
    k8s.add_argument("--namespace", default="llm", help="the sidecar's (and the Gateway's)")
    k8s.add_argument(
        "--pool-service",
        type=_pool_service,
        action="append",
        default=[],
        metavar="POOL=SERVICE:PORT",
        help="the Service in front of a pool's engines",
    )
    k8s.add_argument(
        "--inference-pool",
        type=_pool_cluster,
        action="append",
        default=[],
        metavar="POOL=NAME",
        help="envoy-gateway: a pool served by an InferencePool of this name",
    )
    k8s.add_argument("--gateway", default="inference-gateway", help="envoy-gateway: the Gateway")
    k8s.add_argument("--listener", default="http", help="envoy-gateway: its listener")
    k8s.add_argument("--gateway-namespace", default="istio-system", help="istio: the gateway's")
    k8s.add_argument(
        "--gateway-label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="istio: the workload selector (default istio=ingressgateway)",
    )
    k8s.add_argument("--port", type=int, default=8080, help="istio: the listener's port")
    k8s.add_argument(
        "--istio-context",
        choices=("GATEWAY", "SIDECAR_INBOUND"),
        default="GATEWAY",
        help="istio: the ingress gateway, or the engines' own sidecars",
    )
    k8s.add_argument(
        "--before-filter",
        default="envoy.filters.http.router",
        help="istio: the HTTP filter slogate's go before (an endpoint picker's ext_proc)",
    )
    k8s.add_argument(
        "--skip-route",
        action="append",
        default=[],
        metavar="NAME",
        help="istio: a route of yours that serves no policy path (ext_proc off there)",
    )


def cmd_envoy_config(args: argparse.Namespace) -> int:
    import yaml

    from tooling.envoy_config import EnvoyPorts, build_bootstrap
    from tooling.envoy_config.fragment import (
        FragmentTarget,
        MergeError,
        build_fragment,
        merge_fragment,
    )

    if args.contract:
        from tooling.envoy_config.fragment import contract_table

        print(contract_table())
        return 0
    policy = load_policy(args.policy)
    ports = EnvoyPorts(args.listen_port, args.admin_port, args.sidecar_port, args.host)
    target = FragmentTarget(args.host, args.sidecar_port, dict(args.pool_cluster))
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


def cmd_k8s(args: argparse.Namespace) -> int:
    from tooling.k8s import DEFAULT_IMAGE, write_documents, write_manifests
    from tooling.mesh import MeshError, MeshTarget, render_istio
    from tooling.mesh_gateway import render_envoy_gateway

    image = args.image or DEFAULT_IMAGE
    if args.mesh is None:
        out = args.out or Path("deploy/k8s/slogate.yaml")
        write_manifests(args.policy, out, image=image, replicas=args.replicas)
        print(f"wrote {out}")
        return 0
    target = MeshTarget(
        namespace=args.namespace,
        image=image,
        replicas=args.replicas,
        pool_services=dict(args.pool_service),
        inference_pools=dict(args.inference_pool),
        gateway=args.gateway,
        listener=args.listener,
        gateway_namespace=args.gateway_namespace,
        gateway_labels=dict(args.gateway_label) or {"istio": "ingressgateway"},
        port=args.port,
        istio_context=args.istio_context,
        skip_routes=tuple(args.skip_route),
        before_filter=args.before_filter,
    )
    render = render_istio if args.mesh == "istio" else render_envoy_gateway
    try:
        documents = render(args.policy, target)
    except MeshError as error:
        print(f"slogate k8s --mesh {args.mesh}: {error}", file=sys.stderr)
        return 2
    out = args.out or Path(f"deploy/k8s/slogate-{args.mesh}.yaml")
    write_documents(documents, out, f"slogate k8s --mesh {args.mesh}")
    print(f"wrote {out}")
    return 0
