"""`slogate k8s --mesh istio|envoy-gateway`: the manifests are valid against the projects'
published CRD schemas (deploy/k8s/schemas), the committed ones are what the code renders,
and what a mesh cannot take is refused. The Envoy configuration they make, run by the real
Envoy: tests/e2e/tooling/render/test_mesh.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extproc.request.contract import (
    POOL_HEADER,
    SIDECAR_SET_HEADERS,
)
from extproc.service.replies import WAIT_REPLY_MARGIN_MS, wait_reply_ms
from policy.loader import load_policy
from tests.support.mesh import ENVOY_GATEWAY, ISTIO, by_kind, ms
from tests.support.stack import EXAMPLE_POLICY, ROOT
from tooling.render.k8s import SIDECAR_PORT, write_documents
from tooling.render.mesh import MeshError, MeshTarget, render_istio
from tooling.render.mesh_gateway import render_envoy_gateway

SCHEMAS = ROOT / "deploy" / "k8s" / "schemas"
SCHEMA_FILES = {
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): "envoyfilters.networking.istio.io.v1alpha3",
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"): (
        "envoyextensionpolicies.gateway.envoyproxy.io.v1alpha1"
    ),
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyPatchPolicy"): (
        "envoypatchpolicies.gateway.envoyproxy.io.v1alpha1"
    ),
    ("gateway.envoyproxy.io/v1alpha1", "ClientTrafficPolicy"): (
        "clienttrafficpolicies.gateway.envoyproxy.io.v1alpha1"
    ),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproutes.gateway.networking.k8s.io.v1",
    ("llm-d.ai/v1alpha2", "InferenceObjective"): "inferenceobjectives.llm-d.ai.v1alpha2",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors.monitoring.coreos.com.v1",
}
COMMITTED = {
    "slogate-istio.yaml": (render_istio, ISTIO, "slogate k8s --mesh istio"),
    "slogate-envoy-gateway.yaml": (
        render_envoy_gateway,
        ENVOY_GATEWAY,
        "slogate k8s --mesh envoy-gateway",
    ),
}


def schema(document: dict[str, Any]) -> dict[str, Any]:
    name = SCHEMA_FILES[(document["apiVersion"], document["kind"])]
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.json").read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_manifests_are_what_the_code_renders(name: str, tmp_path: Path) -> None:
    render, target, command = COMMITTED[name]
    out = tmp_path / name
    write_documents(render(EXAMPLE_POLICY, target), out, command)
    committed = ROOT / "deploy" / "k8s" / name
    assert committed.read_text() == out.read_text(), "run `make k8s`"


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_custom_resource_meets_its_projects_schema(name: str) -> None:
    render, target, _ = COMMITTED[name]
    documents = render(EXAMPLE_POLICY, target)
    custom = [d for d in documents if (d["apiVersion"], d["kind"]) in SCHEMA_FILES]
    assert len(custom) >= (1 if name == "slogate-istio.yaml" else 5)
    for document in custom:
        jsonschema.validate(document, schema(document))


def test_the_schemas_catch_a_wrong_manifest() -> None:
    """The check can fail: a body mode the API does not have, an unknown patch operation."""
    documents = render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY)
    extension = copy.deepcopy(by_kind(documents, "EnvoyExtensionPolicy"))
    extension["spec"]["extProc"][0]["processingMode"]["request"]["body"] = "Whole"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(extension, schema(extension))
    envoy_filter = copy.deepcopy(by_kind(render_istio(EXAMPLE_POLICY, ISTIO), "EnvoyFilter"))
    envoy_filter["spec"]["configPatches"][0]["patch"]["operation"] = "PREPEND"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(envoy_filter, schema(envoy_filter))


def test_the_sidecar_is_reachable_by_the_gateway_only() -> None:
    callers = {
        "istio": {"istio": "ingressgateway"},
        "envoy-gateway": {
            "gateway.envoyproxy.io/owning-gateway-name": "inference-gateway",
            "gateway.envoyproxy.io/owning-gateway-namespace": "llm",
        },
    }
    for mesh, documents in (
        ("istio", render_istio(EXAMPLE_POLICY, ISTIO)),
        ("envoy-gateway", render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY)),
    ):
        service = by_kind(documents, "Service")
        grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc["port"] == SIDECAR_PORT and grpc["appProtocol"] == "grpc"
        rule = by_kind(documents, "NetworkPolicy")["spec"]["ingress"][0]
        assert rule["ports"] == [{"port": SIDECAR_PORT, "protocol": "TCP"}]
        assert rule["from"][0]["podSelector"]["matchLabels"] == callers[mesh]
        args = by_kind(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--host") + 1] == "0.0.0.0"


def test_envoy_gateway_routes_pools_on_the_sidecars_header_and_strips_clients_copies() -> None:
    documents = render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY)
    rules = by_kind(documents, "HTTPRoute")["spec"]["rules"]
    backends = [rule["backendRefs"][0] for rule in rules]
    assert backends[1] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "long-context",
    }
    assert backends[0] == {"name": "vllm-default", "port": 8000}
    for rule, pool in zip(rules, ("default", "long", "fallback"), strict=True):
        assert all(
            m["headers"] == [{"type": "Exact", "name": POOL_HEADER, "value": pool}]
            for m in rule["matches"]
        )
    client = by_kind(documents, "ClientTrafficPolicy")["spec"]
    assert set(client["headers"]["earlyRequestHeaders"]["remove"]) == set(SIDECAR_SET_HEADERS)
    objectives = {
        d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "InferenceObjective"
    }
    assert {name: spec["priority"] for name, spec in objectives.items()} == {
        "slogate-critical": 10,
        "slogate-standard": 0,
        "slogate-sheddable": -10,
    }


def _values(document: Any, key: str) -> list[Any]:
    """Every value of `key` anywhere in `document`."""
    if isinstance(document, dict):
        found = [document[key]] if key in document else []
        return found + [v for item in document.values() for v in _values(item, key)]
    if isinstance(document, list):
        return [v for item in document for v in _values(item, key)]
    return []


def test_both_meshes_let_envoy_wait_past_the_waiting_rooms_own_answer() -> None:
    """The override for a request waiting the policy's longest wait (its wait, the message
    timeout, the margin for a sidecar starved past its deadline) is what each mesh's
    ext_proc filter allows at most: Envoy ignores a larger override, and a smaller maximum
    would cut the margin the room's 503 needs to come before Envoy's 504."""
    policy = load_policy(EXAMPLE_POLICY)
    wanted = wait_reply_ms(policy.longest_wait_s, policy.message_timeout_ms)
    assert wanted >= policy.message_timeout_ms + policy.longest_wait_s * 1000 + (
        WAIT_REPLY_MARGIN_MS
    )
    envoy_filter = by_kind(render_istio(EXAMPLE_POLICY, ISTIO), "EnvoyFilter")
    assert [ms(v) for v in _values(envoy_filter, "maxMessageTimeout")] == [wanted]
    patches = by_kind(render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY), "EnvoyPatchPolicy")
    operations = [p["operation"] for p in patches["spec"]["jsonPatches"]]
    values = [o["value"] for o in operations if o["path"].endswith("/max_message_timeout")]
    assert [ms(v) for v in values] == [wanted]
    # An Envoy Gateway idle timer outlasts it too (ClientTrafficPolicy).
    client = by_kind(render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY), "ClientTrafficPolicy")
    assert ms(client["spec"]["timeout"]["http"]["streamIdleTimeout"]) > wanted


def test_what_a_mesh_cannot_take_is_refused() -> None:
    with pytest.raises(MeshError, match="no Service for pools"):
        render_istio(EXAMPLE_POLICY, MeshTarget(pool_services={"default": ("a", 1)}))
    raw = yaml.safe_load(EXAMPLE_POLICY.read_text())
    raw["jwt"] = {"issuer": "https://auth.example.com/", "audiences": ["x"], "jwks_file": "/k"}
    path = Path(__file__).parents[2] / "data" / "_jwt_policy.yaml"
    try:
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(MeshError, match="jwt"):
            render_envoy_gateway(path, ENVOY_GATEWAY)
    finally:
        path.unlink(missing_ok=True)


# --- Istio: the patches applied as istiod applies them, run by the real Envoy -------------


# --- Envoy Gateway: the JSON patches on a listener shaped as Envoy Gateway makes it -------
