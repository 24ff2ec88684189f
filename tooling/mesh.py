"""slogate in a mesh's Envoys: Istio (an EnvoyFilter) and Envoy Gateway (an
EnvoyExtensionPolicy, an EnvoyPatchPolicy and an HTTPRoute for the pools), plus the sidecar's
own Deployment, Service and NetworkPolicy, rendered from a policy.

What lives here: `MeshTarget` (where in the cluster things are), `render_istio`,
`render_envoy_gateway` and `sidecar_workload`. The Envoy pieces inside are the ones the
bootstrap and the fragment are made of (tooling.envoy_config); the names come from the
contract (extproc.request.contract). A mesh's Envoys reach the sidecar over the network, so
it listens on 0.0.0.0 and a NetworkPolicy lets only the gateway's pods call its gRPC port
(ext_proc and the access log both arrive there: anyone else could report usage).

How each mesh expresses slogate's pieces (README "Into an Envoy you already run"):
- Istio: every piece is an EnvoyFilter patch: the filters INSERT_BEFORE the router (in
  order), the access log and the manager's settings MERGEd into the HTTP connection
  manager, the pool routes INSERT_FIRST into the route configuration (they match the
  sidecar's metadata, as in slogate's own bootstrap), the body limit MERGEd into the
  virtual hosts, and ext_proc disabled on the operator's routes named with `skip_routes`.
  The sidecar is reached through Istio's own outbound cluster for its Service (mTLS
  included), so no cluster is added.
- Envoy Gateway: ext_proc and the usage tap (Lua) are an EnvoyExtensionPolicy on the
  Gateway; the pools are an HTTPRoute whose rules match the `x-slogate-pool` header the
  sidecar sets (Gateway API has no metadata match), and a ClientTrafficPolicy removes a
  client's copy of it before any filter runs (early header mutation), unescapes slashes,
  and sets the stream idle timeout and the buffer limit; what no policy type can say (the
  gRPC access log with its tags, `max_message_timeout` for the waiting room, the largest
  gRPC message) is an EnvoyPatchPolicy on the xDS names Envoy Gateway gives them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm

from extproc.request.contract import (
    EXT_PROC_FILTER,
    METADATA_NAMESPACE,
    OBJECTIVE_PREFIX,
    POOL_HEADER,
    SIDECAR_FAILURE_STATUS,
    SIDECAR_SET_HEADERS,
)
from policy import FailureMode, Policy, Tier, load_policy
from tooling.envoy_config.bootstrap import manager_settings
from tooling.envoy_config.filters import access_log, slogate_filters, usage_tap_lua
from tooling.envoy_config.fragment import HCM_TYPE
from tooling.envoy_config.routes import ext_proc_per_route, pool_routes
from tooling.k8s import METRICS_PORT, SIDECAR_PORT, monitor, redis_secret, sidecar_container

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
    image: str = "ghcr.io/slogate/slogate:0.1.0"
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

    def host(self, service: str) -> str:
        return service if "." in service else f"{service}.{self.namespace}.svc.cluster.local"

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name}


def _check(policy: Policy, target: MeshTarget, inference_pools: bool) -> None:
    if policy.jwt is not None:
        raise MeshError(
            "a policy with `jwt:` is not rendered for a mesh yet: the mesh verifies tokens "
            "its own way (Istio's RequestAuthentication, Envoy Gateway's SecurityPolicy); "
            "use API keys, or slogate's own bootstrap"
        )
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
    """The sidecar on its own: policy ConfigMap, Redis Secret, Deployment, Service (gRPC with
    appProtocol grpc, so a mesh speaks HTTP/2 to it), a NetworkPolicy letting only the pods
    labelled `callers` (the gateway's Envoys, in any namespace) reach its gRPC port, and a
    PodMonitor."""
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
                    "containers": [sidecar_container(name, target.image, host="0.0.0.0")],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
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
    pod_monitor = monitor(name, labels)
    pod_monitor["metadata"]["namespace"] = target.namespace
    return [config, secret, deployment, service, network, pod_monitor]


def eg_proxy_labels(target: MeshTarget) -> dict[str, str]:
    """The labels Envoy Gateway puts on a Gateway's Envoy pods (in its own namespace)."""
    return {
        "gateway.envoyproxy.io/owning-gateway-name": target.gateway,
        "gateway.envoyproxy.io/owning-gateway-namespace": target.namespace,
    }


def _sidecar_cluster(target: MeshTarget) -> str:
    """Istio's own outbound cluster for the sidecar's Service (mTLS where the mesh has it)."""
    return f"outbound|{SIDECAR_PORT}||{target.host(target.name)}"


def _manager_patch(policy: Policy, cluster: str) -> dict[str, Any]:
    settings = hcm.HttpConnectionManager(
        access_log=[access_log(cluster)], **manager_settings(policy)
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


def eg_names(target: MeshTarget) -> dict[str, str]:
    """The xDS names Envoy Gateway (v1.9, the default naming scheme) gives what it makes
    from these resources: what the EnvoyPatchPolicy's patches point at."""
    gateway = f"{target.namespace}/{target.gateway}/{target.listener}"
    policy = f"envoyextensionpolicy/{target.namespace}/{target.name}"
    return {
        "listener": gateway,
        "route_configuration": gateway,
        "ext_proc_cluster": f"{policy}/extproc/0",
        "ext_proc_filter": f"envoy.filters.http.ext_proc/{policy}/extproc/0",
    }


def render_envoy_gateway(policy_path: Path, target: MeshTarget) -> list[dict[str, Any]]:
    """The sidecar's workload, an EnvoyExtensionPolicy (ext_proc + the usage tap), an
    HTTPRoute for the pools, and an EnvoyPatchPolicy for the rest."""
    policy = load_policy(policy_path)
    _check(policy, target, inference_pools=True)
    names = eg_names(target)
    meta = {"name": target.name, "namespace": target.namespace, "labels": target.labels}
    gateway_ref = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": target.gateway}
    extension = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyExtensionPolicy",
        "metadata": meta,
        "spec": {
            "targetRefs": [gateway_ref],
            "extProc": [
                {
                    "backendRefs": [{"name": target.name, "port": SIDECAR_PORT}],
                    # Request headers go only with a `request` entry; the body is buffered.
                    "processingMode": {
                        "request": {"body": "Buffered"},
                        "allowModeOverride": True,
                    },
                    "messageTimeout": f"{policy.message_timeout_ms}ms",
                    "failOpen": policy.failure_mode is FailureMode.OPEN,
                    "statusOnError": SIDECAR_FAILURE_STATUS,
                    "metadata": {"writableNamespaces": [METADATA_NAMESPACE]},
                }
            ],
            "lua": [{"type": "Inline", "inline": usage_tap_lua()}],
        },
    }
    paths = sorted(policy.paths.apis)
    pools = {
        "apiVersion": f"{GATEWAY_GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": {**meta, "name": f"{target.name}-pools"},
        "spec": {
            "parentRefs": [{"name": target.gateway, "sectionName": target.listener}],
            "rules": [_pool_rule(pool, paths, target) for pool in policy.pools],
        },
    }
    # Before any filter or route sees the request: a client's copies of the headers the
    # sidecar sets are gone (the pool routes match one), even where ext_proc fails open.
    idle_s = math.ceil(_duration_s(manager_settings(policy)["stream_idle_timeout"]))
    client = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "ClientTrafficPolicy",
        "metadata": meta,
        "spec": {
            "targetRefs": [{**gateway_ref, "sectionName": target.listener}],
            "headers": {"earlyRequestHeaders": {"remove": list(SIDECAR_SET_HEADERS)}},
            # normalize_path and merge_slashes are Envoy Gateway's defaults already.
            "path": {"escapedSlashesAction": "UnescapeAndForward"},
            "timeout": {"http": {"streamIdleTimeout": f"{idle_s}s"}},
            "connection": {"bufferLimit": policy.max_body_bytes},
        },
    }
    hcm_path = "/default_filter_chain/filters/0/typed_config"
    wait_ms = policy.message_timeout_ms + math.ceil(policy.longest_wait_s * 1000)
    listener_type = "type.googleapis.com/envoy.config.listener.v3.Listener"
    ext_proc_filter = (
        f"$.default_filter_chain.filters[0].typed_config.http_filters"
        f"[?@.name=='{names['ext_proc_filter']}']"
    )
    operations: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": f"{hcm_path}/access_log/-",
            "value": access_log(names["ext_proc_cluster"]).to_dict(casing=_snake()),
        },
        {  # the waiting room lifts one message's timeout; Envoy honours that up to this
            "op": "add",
            "jsonPath": ext_proc_filter,
            "path": "/typed_config/max_message_timeout",
            "value": f"{wait_ms / 1000:g}s",
        },
        {  # the body mutation of a large prompt comes back in one message
            "op": "add",
            "jsonPath": ext_proc_filter,
            "path": "/typed_config/grpc_service/envoy_grpc/max_receive_message_length",
            "value": policy.max_body_bytes + (1 << 20),
        },
    ]
    patch_policy = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": meta,
        "spec": {
            "targetRef": gateway_ref,
            "type": "JSONPatch",
            "priority": 0,
            "jsonPatches": [
                {"type": listener_type, "name": names["listener"], "operation": operation}
                for operation in operations
            ],
        },
    }
    return [
        *sidecar_workload(policy_path, target, eg_proxy_labels(target)),
        extension,
        pools,
        client,
        patch_policy,
        *inference_objectives(policy, target),
    ]


# What each tier is to an endpoint picker: its InferenceObjective's priority (higher first;
# a negative one is what the picker sheds first when the pool is saturated).
TIER_PRIORITY = {Tier.CRITICAL: 10, Tier.STANDARD: 0, Tier.SHEDDABLE: -10}


def inference_objectives(policy: Policy, target: MeshTarget) -> list[dict[str, Any]]:
    """One InferenceObjective per tier, named as the sidecar's objective header says, for
    the first pool served by an InferencePool: an objective has one pool, and the header
    names one objective, so a second InferencePool would need objectives of the same names
    (one namespace holds one of each)."""
    served = [target.inference_pools[p] for p in policy.pools if p in target.inference_pools]
    first = served[0] if served else None
    if first is None:
        return []
    return [
        {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {
                "name": f"{OBJECTIVE_PREFIX}{tier.value}",
                "namespace": target.namespace,
                "labels": target.labels,
            },
            "spec": {
                "priority": priority,
                "poolRef": {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": first},
            },
        }
        for tier, priority in TIER_PRIORITY.items()
    ]


def _duration_s(value: Any) -> float:
    return float(value.total_seconds())


def _snake() -> Any:
    """betterproto's snake_case casing: Envoy Gateway's JSON patches see proto field names."""
    import betterproto2

    return betterproto2.Casing.SNAKE


def _pool_rule(pool: str, paths: list[str], target: MeshTarget) -> dict[str, Any]:
    """A pool's rule: the header the sidecar sets on an admitted request, on each inference
    path (a path prefix beats the operator's shorter `/v1` prefix, Gateway API's precedence)."""
    if pool in target.inference_pools:
        name = target.inference_pools[pool]
        backend: dict[str, Any] = {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": name}
    else:
        service, port = target.pool_services[pool]
        backend = {"name": service, "port": port}
    return {
        "matches": [
            {
                "path": {"type": "PathPrefix", "value": path},
                "headers": [{"type": "Exact", "name": POOL_HEADER, "value": pool}],
            }
            for path in paths
        ],
        "backendRefs": [backend],
    }
