"""`slogate k8s`: the Kubernetes manifests for a policy (an Envoy + sidecar pod), slogate
for a mesh's Envoys (Istio, Envoy Gateway), or slogate as the endpoint picker of
InferencePools (`--endpoint-picker`); tooling.render renders them."""

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


def _pool_label(value: str) -> tuple[str, str]:
    pool, _, label = value.partition("=")
    if not pool or not _label_ok(label):
        raise argparse.ArgumentTypeError(f"expected POOL=KEY=VALUE, got {value!r}")
    return pool, label


def _label_ok(label: str) -> bool:
    key, _, value = label.partition("=")
    return bool(key and value)


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
    k8s.add_argument(
        "--sidecar-listener",
        choices=("unix", "loopback"),
        default=None,
        help="the pod's Envoy reaches ext_proc and the access log on a Unix socket in a "
        "shared emptyDir (default: the cheaper per request, bench/results/listeners.md) or "
        "on 127.0.0.1; the pod's address serves only the health port and /metrics",
    )
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
    k8s.add_argument(
        "--endpoint-picker",
        type=pool_cluster,
        action="append",
        default=[],
        metavar="POOL=INFERENCEPOOL",
        help="slogate as the endpoint picker of an InferencePool of this name for the pool "
        "(any conformant gateway calls it); the default pool must be one",
    )
    k8s.add_argument(
        "--pool-selector",
        type=_pool_label,
        action="append",
        default=[],
        metavar="POOL=KEY=VALUE",
        help="--endpoint-picker: a label of the pool's engine pods (the InferencePool's "
        "selector; repeat for more)",
    )
    k8s.add_argument(
        "--tls-secret",
        default=None,
        metavar="SECRET",
        help="--endpoint-picker: the sidecar's gRPC port speaks TLS with this "
        "kubernetes.io/tls Secret (probes go to a plain-text health port)",
    )
    k8s.add_argument(
        "--mutual-tls",
        action="store_true",
        help="with --tls-secret: only callers with a client certificate its ca.crt signed",
    )
    k8s.set_defaults(handler=write_k8s)


def write_k8s(args: argparse.Namespace) -> int:
    from tooling.render.inference_pool import render_endpoint_picker, selectors
    from tooling.render.k8s import (
        DEFAULT_IMAGE,
        DEFAULT_POD_LISTENER,
        PodListener,
        write_documents,
        write_manifests,
    )
    from tooling.render.mesh import MeshError, MeshTarget, render_istio
    from tooling.render.mesh_gateway import render_envoy_gateway

    image = args.image or DEFAULT_IMAGE
    picker = bool(args.endpoint_picker)
    if picker and args.mesh is not None:
        print(
            "slogate k8s: --endpoint-picker and --mesh are two ways of standing in the "
            "gateway's path: slogate as the InferencePool's picker, or as a filter of its own "
            "in front of the mesh's routes; choose one",
            file=sys.stderr,
        )
        return 2
    if (args.tls_secret or args.mutual_tls) and not picker:
        print(
            "slogate k8s: --tls-secret goes with --endpoint-picker (a mesh reaches the sidecar "
            "through its own mTLS; the pod's Envoy on loopback)",
            file=sys.stderr,
        )
        return 2
    if args.sidecar_listener is not None and (picker or args.mesh is not None):
        print(
            "slogate k8s: --sidecar-listener is for the pod with its own Envoy (a mesh or a "
            "gateway reaches the sidecar over the network)",
            file=sys.stderr,
        )
        return 2
    if args.mutual_tls and not args.tls_secret:
        print("slogate k8s: --mutual-tls needs --tls-secret", file=sys.stderr)
        return 2
    if args.mesh is None and not picker:
        out = args.out or Path("deploy/k8s/slogate.yaml")
        listener = (
            PodListener(args.sidecar_listener) if args.sidecar_listener else DEFAULT_POD_LISTENER
        )
        write_manifests(args.policy, out, image=image, replicas=args.replicas, listener=listener)
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
        # The picker's callers: the gateway's pods if named, else any pod (any gateway).
        gateway_labels=dict(args.gateway_label) or ({} if picker else {"istio": "ingressgateway"}),
        port=args.port,
        istio_context=args.istio_context,
        skip_routes=tuple(args.skip_route),
        before_filter=args.before_filter,
        endpoint_pickers=dict(args.endpoint_picker),
        pool_selectors=selectors(args.pool_selector),
        tls_secret=args.tls_secret,
        mutual_tls=args.mutual_tls,
    )
    if picker:
        render, mode = render_endpoint_picker, "endpoint-picker"
        command = "slogate k8s --endpoint-picker"
    else:
        render = render_istio if args.mesh == "istio" else render_envoy_gateway
        mode, command = args.mesh, f"slogate k8s --mesh {args.mesh}"
    try:
        documents = render(args.policy, target)
    except MeshError as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    out = args.out or Path(f"deploy/k8s/slogate-{mode}.yaml")
    write_documents(documents, out, command)
    print(f"wrote {out}")
    return 0
