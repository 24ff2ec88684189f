"""slogate in a mesh's Envoys: Istio (an EnvoyFilter) and Envoy Gateway (an
EnvoyExtensionPolicy, an EnvoyPatchPolicy and an HTTPRoute for the pools), plus the sidecar's
own Deployment, Service and NetworkPolicy, rendered from a policy.

What lives here: `MeshTarget` (where in the cluster things are), `render_istio`,
`render_envoy_gateway` and `sidecar_workload`. The Envoy pieces inside are the ones the
bootstrap and the fragment are made of (tooling.render.envoy_config); the names come from the
contract (extproc.request.contract). A mesh's Envoys reach the sidecar over the network, so
it listens on 0.0.0.0 and a NetworkPolicy lets only the gateway's pods call its gRPC port
(ext_proc and the access log both arrive there: anyone else could report usage).

How each mesh expresses slogate's pieces (README "Into an Envoy you already run"):
- Istio: every piece is an EnvoyFilter patch: the filters INSERT_BEFORE the router (in
  order), the access log and the manager's settings MERGEd into the HTTP connection
  manager, the pool routes INSERT_FIRST into the route configuration (they match the
  sidecar's metadata, as in slogate's own bootstrap, and retry a refused connection once),
  the engines' picking, health checks and outlier detection MERGEd into Istio's outbound
  cluster of each pool's Service (headless: slogate names the pods its DNS returns), the
  body limit MERGEd into the virtual hosts, and ext_proc disabled on the operator's routes
  named with `skip_routes`.
  The sidecar is reached through Istio's own outbound cluster for its Service (mTLS
  included), so no cluster is added.
- Envoy Gateway: ext_proc and the usage tap (Lua) are an EnvoyExtensionPolicy on the
  Gateway; the pools are an HTTPRoute whose rules match the `x-slogate-pool` header the
  sidecar sets (Gateway API has no metadata match), and a ClientTrafficPolicy removes a
  client's copy of it before any filter runs (early header mutation), unescapes slashes,
  and sets the stream idle timeout and the buffer limit; what no policy type can say (the
  gRPC access log with its tags, `max_message_timeout` for the waiting room, the largest
  gRPC message, and the engines' picking, health checks and outlier detection on the
  cluster of each pool a Service serves) is an EnvoyPatchPolicy on the xDS names Envoy
  Gateway gives them (tooling.render.mesh_gateway). Not rendered there: the retry of a refused
  connection (a BackendTrafficPolicy `retry` on connect-failure and refused-stream does it;
  its schema is not vendored here to check it against).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envoy_data_plane.envoy.config.cluster.v3 as envoy_cluster
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm

from extproc.request.contract import (
    EXT_PROC_FILTER,
)
from policy._data_path import ExtProcMessages
from policy.loader import load_policy
from policy.schema import Policy
from tooling.render.envoy_config.bootstrap import manager_settings
from tooling.render.envoy_config.engines import engine_cluster_options
from tooling.render.envoy_config.filters import (
    access_logs,
    slogate_filters,
)
from tooling.render.envoy_config.fragment import HCM_TYPE
from tooling.render.envoy_config.routes import ext_proc_per_route, pool_routes
from tooling.render.k8s import (
    DEFAULT_IMAGE,
    METRICS_PORT,
    SIDECAR_PORT,
    admin_token_maker,
    disruption_budget,
    monitor,
    pod_hardening,
    redis_secret,
    sidecar_container,
    sidecar_volumes,
)

HCM_NAME = "envoy.filters.network.http_connection_manager"
ROUTER_NAME = "envoy.filters.http.router"
GATEWAY_GROUP = "gateway.networking.k8s.io"
INFERENCE_GROUP = "inference.networking.k8s.io"


class MeshError(ValueError):
    """The policy or target cannot be rendered for this mesh; the message says why."""


@dataclass(frozen=True, slots=True)
class MeshTarget:
    namespace: str = "llm"  # the sidecar's (and, for Envoy Gateway, the Gateway's)
    name: str = "slogate"
    image: str = DEFAULT_IMAGE
    replicas: int = 2
    # pool -> (Service, port) of its engines in `namespace` (a name with a dot: another one)
    pool_services: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # pool -> an InferencePool (Gateway API inference extension) of that name: the route
    # sends there and the pool's endpoint picker chooses the engine (Envoy Gateway).
    inference_pools: Mapping[str, str] = field(default_factory=dict)
    # Envoy Gateway: the Gateway and its listener; Istio: the gateway's namespace and
    # labels (the ingress gateway by default) and the port its listener serves on.
    gateway: str = "inference-gateway"
    listener: str = "http"
    gateway_namespace: str = "istio-system"
    gateway_labels: Mapping[str, str] = field(default_factory=lambda: {"istio": "ingressgateway"})
    port: int = 8080
    istio_context: str = "GATEWAY"  # or SIDECAR_INBOUND (port: the engines' target port)
    skip_routes: tuple[str, ...] = ()  # Istio: routes of yours that serve no policy path
    # Istio: the filter slogate's go just before: the router, or an endpoint picker's
    # ext_proc (which must see slogate's decision, so runs after it).
    before_filter: str = ROUTER_NAME
    # slogate as the endpoint picker (tooling.render.inference_pool): pool -> the
    # InferencePool it picks for, and pool -> its engine pods' labels (the pool's selector).
    endpoint_pickers: Mapping[str, str] = field(default_factory=dict)
    pool_selectors: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # The gRPC port speaks TLS with this kubernetes.io/tls Secret (tls.crt, tls.key), and
    # asks callers for a client certificate its ca.crt signed with `mutual_tls`.
    tls_secret: str | None = None
    mutual_tls: bool = False

    def host(self, service: str) -> str:
        return service if "." in service else f"{service}.{self.namespace}.svc.cluster.local"

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name}


def _check(
    policy: Policy, target: MeshTarget, inference_pools: bool, services: bool = True
) -> None:
    """What every render needs: no `jwt:`, two messages, and (with `services`) a Service or
    an InferencePool for every pool."""
    if policy.jwt is not None:
        raise MeshError(
            "a policy with `jwt:` is not rendered for a mesh yet: the mesh verifies tokens "
            "its own way (Istio's RequestAuthentication, Envoy Gateway's SecurityPolicy); "
            "use API keys, or slogate's own bootstrap"
        )
    if policy.data_path.messages is not ExtProcMessages.TWO:
        raise MeshError(
            "data_path.messages: one is not rendered for a mesh: it needs routes of its own "
            "on every inference path (tooling.render.envoy_config.one_message); use "
            "data_path.messages: two, or slogate's own bootstrap"
        )
    if not services:
        return
    named = set(target.pool_services) | (set(target.inference_pools) if inference_pools else set())
    missing = sorted(set(policy.pools) - named)
    if missing:
        flag = "--pool-service POOL=SERVICE:PORT" + (
            " or --inference-pool POOL=NAME" if inference_pools else ""
        )
        raise MeshError(f"no Service for pools {missing}: name each with {flag}")


def sidecar_workload(
    policy_path: Path, target: MeshTarget, callers: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The sidecar on its own: policy ConfigMap, Redis Secret, Deployment (hardened and spread
    as tooling.render.k8s's pod), Service (gRPC with appProtocol grpc, so a mesh speaks HTTP/2 to
    it), a NetworkPolicy letting only the pods labelled `callers` (the gateway's Envoys, in
    any namespace) reach its gRPC port, a PodDisruptionBudget and a PodMonitor."""
    policy = load_policy(policy_path)
    name, labels = target.name, target.labels
    meta = {"name": name, "namespace": target.namespace, "labels": labels}
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-config"},
        "data": {"policy.yaml": policy_path.read_text(encoding="utf-8")},
    }
    secret = redis_secret(policy, name, labels)
    secret["metadata"]["namespace"] = target.namespace
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": target.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **pod_hardening(labels),
                    "initContainers": [admin_token_maker(target.image)],
                    "containers": [
                        sidecar_container(name, target.image, target.tls_secret, target.mutual_tls)
                    ],
                    "volumes": sidecar_volumes(name, target.tls_secret),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": labels,
            "ports": [
                {
                    "name": "grpc",
                    "port": SIDECAR_PORT,
                    "targetPort": SIDECAR_PORT,
                    "appProtocol": "grpc",
                },
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
            ],
        },
    }
    network = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {  # ext_proc and the access log: the gateway's Envoys only
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(callers)},
                        }
                    ],
                    "ports": [{"port": SIDECAR_PORT, "protocol": "TCP"}],
                },
                {"ports": [{"port": METRICS_PORT, "protocol": "TCP"}]},  # Prometheus
            ],
        },
    }
    budget = disruption_budget(name, labels)
    budget["metadata"]["namespace"] = target.namespace
    pod_monitor = monitor(name, labels)
    pod_monitor["metadata"]["namespace"] = target.namespace
    return [config, secret, deployment, service, network, budget, pod_monitor]


def _sidecar_cluster(target: MeshTarget) -> str:
    """Istio's own outbound cluster for the sidecar's Service (mTLS where the mesh has it)."""
    return f"outbound|{SIDECAR_PORT}||{target.host(target.name)}"


def _manager_patch(policy: Policy, cluster: str) -> dict[str, Any]:
    settings = hcm.HttpConnectionManager(
        access_log=access_logs(cluster), **manager_settings(policy)
    ).to_dict()
    return {"name": HCM_NAME, "typedConfig": {"@type": HCM_TYPE, **settings}}


def render_istio(policy_path: Path, target: MeshTarget) -> list[dict[str, Any]]:
    """The sidecar's workload and one EnvoyFilter for the gateway (or the engines' sidecars
    with `istio_context` SIDECAR_INBOUND)."""
    policy = load_policy(policy_path)
    _check(policy, target, inference_pools=False)
    cluster = _sidecar_cluster(target)
    context = target.istio_context
    http_filter = {
        "context": context,
        "listener": {
            "portNumber": target.port,
            "filterChain": {
                "filter": {"name": HCM_NAME, "subFilter": {"name": target.before_filter}}
            },
        },
    }
    manager = {
        "context": context,
        "listener": {"portNumber": target.port, "filterChain": {"filter": {"name": HCM_NAME}}},
    }
    routes = {"context": context, "routeConfiguration": {"portNumber": target.port}}
    clusters = {
        pool: f"outbound|{port}||{target.host(service)}"
        for pool, (service, port) in target.pool_services.items()
    }
    # Each INSERT_BEFORE lands just before that filter, so the listed order is kept.
    patches: list[dict[str, Any]] = [
        {
            "applyTo": "HTTP_FILTER",
            "match": http_filter,
            "patch": {"operation": "INSERT_BEFORE", "value": f.to_dict()},
        }
        for f in slogate_filters(policy, cluster)
    ]
    patches.append(
        {
            "applyTo": "NETWORK_FILTER",
            "match": manager,
            "patch": {"operation": "MERGE", "value": _manager_patch(policy, cluster)},
        }
    )
    # Each INSERT_FIRST lands first, so the pools go in reversed to keep the policy's order.
    patches += [
        {
            "applyTo": "HTTP_ROUTE",
            "match": routes,
            "patch": {"operation": "INSERT_FIRST", "value": r.to_dict()},
        }
        for r in reversed(pool_routes(policy, clusters))
    ]
    # The engines' clusters (Istio's outbound ones for each pool's Service, which must be
    # headless: slogate names pods, as its DNS lookup of the Service returns them): picked
    # by slogate's metadata, health-checked, their failing engines ejected.
    engine_fields = pb_camel(engine_cluster_options(policy))
    patches += [
        {
            "applyTo": "CLUSTER",
            "match": {"context": context, "cluster": {"name": cluster_name}},
            "patch": {"operation": "MERGE", "value": engine_fields},
        }
        for cluster_name in clusters.values()
    ]
    patches.append(
        {
            "applyTo": "VIRTUAL_HOST",
            "match": routes,
            "patch": {
                "operation": "MERGE",
                "value": {"requestBodyBufferLimit": policy.max_body_bytes},
            },
        }
    )
    disabled = ext_proc_per_route(None, disabled=True)["typed_per_filter_config"]
    patches += [
        {
            "applyTo": "HTTP_ROUTE",
            "match": {
                "context": context,
                "routeConfiguration": {
                    "portNumber": target.port,
                    "vhost": {"route": {"name": route_name}},
                },
            },
            "patch": {
                "operation": "MERGE",
                "value": {
                    "typedPerFilterConfig": {EXT_PROC_FILTER: disabled[EXT_PROC_FILTER].to_dict()}
                },
            },
        }
        for route_name in target.skip_routes
    ]
    namespace = target.namespace if context == "SIDECAR_INBOUND" else target.gateway_namespace
    envoy_filter = {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": target.name, "namespace": namespace, "labels": target.labels},
        "spec": {
            "workloadSelector": {"labels": dict(target.gateway_labels)},
            # Relative operations (INSERT_BEFORE) want a priority (istioctl analyze).
            "priority": 10,
            "configPatches": patches,
        },
    }
    return [*sidecar_workload(policy_path, target, target.gateway_labels), envoy_filter]


def pb_camel(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Cluster fields as the JSON an EnvoyFilter MERGE takes (camelCase)."""
    rendered = envoy_cluster.Cluster(name="x", **fields).to_dict()
    return {k: v for k, v in rendered.items() if k != "name"}
