"""slogate in Envoy Gateway: an EnvoyExtensionPolicy (ext_proc and the usage tap), an
HTTPRoute for the pools, a ClientTrafficPolicy and an EnvoyPatchPolicy for what no policy
type can say, plus the sidecar's own workload (tooling.render.mesh) and, for pools served by an
InferencePool, the InferenceObjectives of the tiers and tenants (tooling.render.inference_pool).

How each piece is expressed, and why: see tooling.render.mesh's docstring (Envoy Gateway).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import envoy_data_plane.envoy.config.cluster.v3 as envoy_cluster

from extproc.request.contract import (
    DESTINATION_NAMESPACE,
    METADATA_NAMESPACE,
    POOL_HEADER,
    SIDECAR_FAILURE_STATUS,
    SIDECAR_SET_HEADERS,
)
from policy.domain import FailureMode
from policy.loader import load_policy
from policy.schema import Policy
from tooling.render.envoy_config.bootstrap import manager_settings
from tooling.render.envoy_config.engines import engine_cluster_options
from tooling.render.envoy_config.filters import access_logs, max_message_timeout_ms
from tooling.render.envoy_config.usage_tap import usage_tap_lua
from tooling.render.inference_pool import inference_objectives
from tooling.render.k8s import SIDECAR_PORT
from tooling.render.mesh import GATEWAY_GROUP, INFERENCE_GROUP, MeshTarget, _check, sidecar_workload


def eg_proxy_labels(target: MeshTarget) -> dict[str, str]:
    """The labels Envoy Gateway puts on a Gateway's Envoy pods (in its own namespace)."""
    return {
        "gateway.envoyproxy.io/owning-gateway-name": target.gateway,
        "gateway.envoyproxy.io/owning-gateway-namespace": target.namespace,
    }


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
                    "metadata": {"writableNamespaces": [METADATA_NAMESPACE, DESTINATION_NAMESPACE]},
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
    wait_ms = max_message_timeout_ms(policy)
    listener_type = "type.googleapis.com/envoy.config.listener.v3.Listener"
    ext_proc_filter = (
        f"$.default_filter_chain.filters[0].typed_config.http_filters"
        f"[?@.name=='{names['ext_proc_filter']}']"
    )
    operations: list[dict[str, Any]] = [
        *(
            {
                "op": "add",
                "path": f"{hcm_path}/access_log/-",
                "value": log.to_dict(casing=_snake()),
            }
            for log in access_logs(names["ext_proc_cluster"])
        ),
        {  # the waiting room lifts one message's timeout; Envoy honours that up to this
            "op": "add",
            "jsonPath": ext_proc_filter,
            "path": "/typed_config/max_message_timeout",
            "value": f"{wait_ms / 1000:.3f}".rstrip("0").rstrip(".") + "s",  # exact
        },
        {  # the body mutation of a large prompt comes back in one message
            "op": "add",
            "jsonPath": ext_proc_filter,
            "path": "/typed_config/grpc_service/envoy_grpc/max_receive_message_length",
            "value": policy.max_body_bytes + (1 << 20),
        },
    ]
    patches = [
        {"type": listener_type, "name": names["listener"], "operation": operation}
        for operation in operations
    ]
    # The engines of each pool a Service serves (an InferencePool's are its picker's): the
    # cluster Envoy Gateway makes for the pool's rule, picked by slogate's metadata,
    # health-checked, its failing engines ejected.
    cluster_type = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    for index, pool in enumerate(policy.pools):
        if pool in target.inference_pools:
            continue
        cluster_name = f"httproute/{target.namespace}/{target.name}-pools/rule/{index}"
        for field, value in pb_snake(engine_cluster_options(policy)).items():
            operation = {"op": "add", "path": f"/{field}", "value": value}
            patches.append({"type": cluster_type, "name": cluster_name, "operation": operation})
    patch_policy = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": meta,
        "spec": {
            "targetRef": gateway_ref,
            "type": "JSONPatch",
            "priority": 0,
            "jsonPatches": patches,
        },
    }
    return [
        *sidecar_workload(policy_path, target, eg_proxy_labels(target)),
        extension,
        pools,
        client,
        patch_policy,
        *_objectives(policy, target),
    ]


def _objectives(policy: Policy, target: MeshTarget) -> list[dict[str, Any]]:
    """The objectives for the first pool served by an InferencePool (an objective has one
    pool: tooling.render.inference_pool.inference_objectives)."""
    served = [target.inference_pools[p] for p in policy.pools if p in target.inference_pools]
    return inference_objectives(policy, target, served[0]) if served else []


def pb_snake(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Cluster fields as proto field names (Envoy Gateway's JSON patches see those)."""
    rendered = envoy_cluster.Cluster(name="x", **fields).to_dict(casing=_snake())
    return {k: v for k, v in rendered.items() if k != "name"}


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
