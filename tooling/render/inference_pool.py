"""The Gateway API inference extension's resources, rendered from a policy: the
InferenceObjectives of slogate's tiers and tenants, and slogate as the endpoint picker of
InferencePools (`slogate k8s --endpoint-picker POOL=NAME`).

What lives here: `TIER_PRIORITY`, `inference_objectives` (one per tier, one per tenant's own
objective, for one InferencePool) and `render_endpoint_picker`: slogate's workload (its
Service's gRPC port declared `http2`, as the extension's conformance resources declare their
pickers'), an InferencePool per pool slogate picks for (its selector the pool's engine pods'
labels, its target ports the policy's engine ports, its `endpointPickerRef` slogate's
Service and gRPC port, failing open or closed as the policy does), the objectives, and an
HTTPRoute sending the policy's inference paths to the default pool's InferencePool. Any
conformant gateway (Istio, Envoy Gateway, kgateway, GKE) then calls slogate as that pool's
picker, with the endpoint picker protocol (extproc.service speaks it).

What is not done here: reading an InferencePool's selector from the Kubernetes API (the
selector is given, `--pool-selector`; slogate finds the engines by the DNS names in the
policy, which must be a headless Service over the same pods), and the gateway's own side of
TLS to the picker (each gateway says it its own way: Istio a DestinationRule, kgateway and
NGINX Gateway Fabric skip verification of the picker's certificate).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policy.domain import FailureMode, Tier, tier_objective
from policy.loader import load_policy
from policy.schema import Policy
from tooling.render.k8s import SIDECAR_PORT
from tooling.render.mesh import (
    GATEWAY_GROUP,
    INFERENCE_GROUP,
    MeshError,
    MeshTarget,
    _check,
    sidecar_workload,
)

# What each tier is to an endpoint picker: its InferenceObjective's priority (higher first;
# a negative one is what the picker sheds first when the pool is saturated).
TIER_PRIORITY = {Tier.CRITICAL: 10, Tier.STANDARD: 0, Tier.SHEDDABLE: -10}
INFERENCE_VERSION = f"{INFERENCE_GROUP}/v1"
OBJECTIVE_VERSION = "llm-d.ai/v1alpha2"  # InferenceObjective moved to llm-d's router
# How a gateway reaches the picker: gRPC is HTTP/2 (the extension's conformance pickers'
# Services say `http2`; llm-d's chart `kubernetes.io/h2c`; both read as HTTP/2 by meshes).
PICKER_APP_PROTOCOL = "http2"
FAILURE_MODES = {FailureMode.OPEN: "FailOpen", FailureMode.CLOSED: "FailClose"}
MAX_TARGET_PORTS = 8  # the InferencePool schema's bound


def inference_objectives(policy: Policy, target: MeshTarget, pool: str) -> list[dict[str, Any]]:
    """One InferenceObjective per tier, named as the sidecar's objective header says, and one
    per tenant objective (`tenants: ... inference_objective:`, its tier's priority), for the
    InferencePool `pool`: an objective has one pool, and the header names one objective, so
    a second InferencePool would need objectives of the same names (one namespace holds one
    of each)."""
    priorities = {tier_objective(tier): priority for tier, priority in TIER_PRIORITY.items()}
    book = policy.tenants
    tenants = [*book.listed.values(), *([book.default] if book.default else [])]
    for tenant in tenants:
        if tenant.inference_objective is not None:
            priorities.setdefault(tenant.inference_objective, TIER_PRIORITY[tenant.tier])
    return [
        {
            "apiVersion": OBJECTIVE_VERSION,
            "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": target.namespace, "labels": target.labels},
            "spec": {
                "priority": priority,
                "poolRef": {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": pool},
            },
        }
        for name, priority in priorities.items()
    ]


def _check_picker(policy: Policy, target: MeshTarget) -> None:
    _check(policy, target, inference_pools=False, services=False)
    if not target.endpoint_pickers:
        raise MeshError("name the InferencePool slogate picks for: --endpoint-picker POOL=NAME")
    unknown = sorted(set(target.endpoint_pickers) - set(policy.pools))
    if unknown:
        raise MeshError(f"no pools {unknown} in the policy (it has {sorted(policy.pools)})")
    if policy.default_pool not in target.endpoint_pickers:
        raise MeshError(
            f"the default pool {policy.default_pool!r} needs an InferencePool too: the route "
            "sends the inference paths there (--endpoint-picker "
            f"{policy.default_pool}=NAME)"
        )
    for pool in target.endpoint_pickers:
        if not target.pool_selectors.get(pool):
            raise MeshError(
                f"pool {pool!r}: name its engine pods' labels with --pool-selector "
                f"{pool}=KEY=VALUE (the InferencePool's selector; not read from the cluster)"
            )
        ports = {port for _, port in policy.pools[pool].endpoints}
        if len(ports) > MAX_TARGET_PORTS:
            raise MeshError(f"pool {pool!r}: {len(ports)} engine ports; an InferencePool has 8")


def _inference_pool(policy: Policy, target: MeshTarget, pool: str) -> dict[str, Any]:
    ports = sorted({port for _, port in policy.pools[pool].endpoints})
    return {
        "apiVersion": INFERENCE_VERSION,
        "kind": "InferencePool",
        "metadata": {
            "name": target.endpoint_pickers[pool],
            "namespace": target.namespace,
            "labels": target.labels,
        },
        "spec": {
            "selector": {"matchLabels": dict(target.pool_selectors[pool])},
            "targetPorts": [{"number": port} for port in ports],
            "endpointPickerRef": {
                "kind": "Service",
                "name": target.name,
                "port": {"number": SIDECAR_PORT},
                "failureMode": FAILURE_MODES[policy.failure_mode],
            },
        },
    }


def render_endpoint_picker(policy_path: Path, target: MeshTarget) -> list[dict[str, Any]]:
    """slogate as the endpoint picker of an InferencePool per pool in
    `target.endpoint_pickers`: its workload, the pools, the objectives and the route."""
    policy = load_policy(policy_path)
    _check_picker(policy, target)
    workload = sidecar_workload(policy_path, target, target.gateway_labels)
    service = next(d for d in workload if d["kind"] == "Service")
    for port in service["spec"]["ports"]:
        if port["name"] == "grpc":
            port["appProtocol"] = PICKER_APP_PROTOCOL
    pools = [_inference_pool(policy, target, pool) for pool in target.endpoint_pickers]
    default = target.endpoint_pickers[policy.default_pool]
    route = {
        "apiVersion": f"{GATEWAY_GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": f"{target.name}-inference",
            "namespace": target.namespace,
            "labels": target.labels,
        },
        "spec": {
            "parentRefs": [{"name": target.gateway, "sectionName": target.listener}],
            "rules": [
                {
                    "matches": [
                        {"path": {"type": "PathPrefix", "value": path}}
                        for path in sorted(policy.paths.apis)
                    ],
                    "backendRefs": [
                        {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": default}
                    ],
                }
            ],
        },
    }
    return [*workload, *pools, *inference_objectives(policy, target, default), route]


def selectors(pairs: list[tuple[str, str]]) -> Mapping[str, Mapping[str, str]]:
    """`--pool-selector POOL=KEY=VALUE` given several times: pool -> its labels."""
    found: dict[str, dict[str, str]] = {}
    for pool, label in pairs:
        key, _, value = label.partition("=")
        found.setdefault(pool, {})[key] = value
    return found
