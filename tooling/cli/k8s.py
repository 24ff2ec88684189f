"""`slogate k8s`: the Kubernetes manifests for a policy (an Envoy + sidecar pod), or
slogate for a mesh's Envoys (Istio, Envoy Gateway); tooling.render renders them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from extproc.runtime.serve_command import policy_arg
from tooling.cli.common import pool_cluster


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


def register(sub: argparse._SubParsersAction) -> None:
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
        type=pool_cluster,
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
    k8s.set_defaults(handler=write_k8s)


def write_k8s(args: argparse.Namespace) -> int:
    from tooling.render.k8s import DEFAULT_IMAGE, write_documents, write_manifests
    from tooling.render.mesh import MeshError, MeshTarget, render_istio
    from tooling.render.mesh_gateway import render_envoy_gateway

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
