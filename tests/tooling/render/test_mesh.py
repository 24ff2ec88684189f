"""`slogate k8s --mesh istio|envoy-gateway` and `--endpoint-picker`: the manifests are valid
against the projects' published CRD schemas (deploy/k8s/schemas), the committed ones are
what the code renders, and what a mesh cannot take is refused. The Envoy configuration
they make, run by the real Envoy: tests/e2e/tooling/render/test_mesh.py."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
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
from tests.support.mesh import ENDPOINT_PICKER, ENVOY_GATEWAY, ISTIO, by_kind, ms
from tests.support.stack import EXAMPLE_POLICY, ROOT
from tooling.render.inference_pool import render_endpoint_picker
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
    ("inference.networking.k8s.io/v1", "InferencePool"): (
        "inferencepools.inference.networking.k8s.io.v1"
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors.monitoring.coreos.com.v1",
}
COMMITTED = {
    "slogate-istio.yaml": (render_istio, ISTIO, "slogate k8s --mesh istio"),
    "slogate-envoy-gateway.yaml": (
        render_envoy_gateway,
        ENVOY_GATEWAY,
        "slogate k8s --mesh envoy-gateway",
    ),
    "slogate-endpoint-picker.yaml": (
        render_endpoint_picker,
        ENDPOINT_PICKER,
        "slogate k8s --endpoint-picker",
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


# --- slogate as the endpoint picker of InferencePools -------------------------------------


def test_slogate_is_the_pickers_service_of_each_inference_pool() -> None:
    documents = render_endpoint_picker(EXAMPLE_POLICY, ENDPOINT_PICKER)
    policy = load_policy(EXAMPLE_POLICY)
    pools = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "InferencePool"}
    assert set(pools) == {"vllm-default", "vllm-long"}
    default = pools["vllm-default"]
    assert default["selector"] == {"matchLabels": {"app": "vllm-default"}}
    # The engines' ports as the policy lists them (the picker names ip:port within these).
    ports = sorted({port for _, port in policy.pools["default"].endpoints})
    assert default["targetPorts"] == [{"number": p} for p in ports]
    assert default["endpointPickerRef"] == {
        "kind": "Service",
        "name": "slogate",
        "port": {"number": SIDECAR_PORT},
        "failureMode": "FailClose" if policy.failure_mode.value == "closed" else "FailOpen",
    }
    service = by_kind(documents, "Service")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == SIDECAR_PORT and grpc["appProtocol"] == "http2"
    # Any conformant gateway: the route's backend is the default pool's InferencePool.
    route = by_kind(documents, "HTTPRoute")["spec"]["rules"]
    assert [r["backendRefs"] for r in route] == [
        [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "vllm-default"}]
    ]
    assert {m["path"]["value"] for m in route[0]["matches"]} == set(policy.paths.apis)
    objectives = [d for d in documents if d["kind"] == "InferenceObjective"]
    assert {d["spec"]["poolRef"]["name"] for d in objectives} == {"vllm-default"}
    # Any pod may call it (no gateway named), over TLS with the Secret mounted.
    rule = by_kind(documents, "NetworkPolicy")["spec"]["ingress"][0]
    assert rule["from"][0]["podSelector"] == {"matchLabels": {}}


def test_a_picker_with_tls_mounts_its_secret_and_is_probed_in_plain_text() -> None:
    deployment = by_kind(render_endpoint_picker(EXAMPLE_POLICY, ENDPOINT_PICKER), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = pod["containers"][0]
    args = sidecar["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/slogate/tls/tls.crt"
    assert args[args.index("--tls-key") + 1] == "/etc/slogate/tls/tls.key"
    assert "--tls-client-ca" not in args
    health = int(args[args.index("--health-port") + 1])
    assert sidecar["readinessProbe"]["grpc"] == {"port": health, "service": "readiness"}
    assert sidecar["livenessProbe"]["grpc"] == {"port": health, "service": "liveness"}
    assert {"name": "tls", "secret": {"secretName": "slogate-tls"}} in pod["volumes"]
    mutual = dataclasses.replace(ENDPOINT_PICKER, mutual_tls=True)
    args = by_kind(render_endpoint_picker(EXAMPLE_POLICY, mutual), "Deployment")["spec"][
        "template"
    ]["spec"]["containers"][0]["args"]
    assert args[args.index("--tls-client-ca") + 1] == "/etc/slogate/tls/ca.crt"
    plain = dataclasses.replace(ENDPOINT_PICKER, tls_secret=None)
    sidecar = by_kind(render_endpoint_picker(EXAMPLE_POLICY, plain), "Deployment")["spec"][
        "template"
    ]["spec"]["containers"][0]
    assert "--tls-cert" not in sidecar["args"] and "--health-port" not in sidecar["args"]
    assert sidecar["readinessProbe"]["grpc"] == {"port": SIDECAR_PORT, "service": "readiness"}


def test_the_inference_pool_schema_catches_a_wrong_pool() -> None:
    pool = copy.deepcopy(
        by_kind(render_endpoint_picker(EXAMPLE_POLICY, ENDPOINT_PICKER), "InferencePool")
    )
    jsonschema.validate(pool, schema(pool))
    pool["spec"]["endpointPickerRef"]["failureMode"] = "Open"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, schema(pool))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"endpoint_pickers": {}}, "--endpoint-picker POOL=NAME"),
        ({"endpoint_pickers": {"long": "vllm-long"}}, "the default pool 'default' needs"),
        ({"endpoint_pickers": {"default": "a", "nope": "b"}}, "no pools ['nope']"),
        ({"pool_selectors": {"default": {"app": "x"}}}, "pool 'long': name its engine pods'"),
    ],
)
def test_what_a_picker_cannot_be_rendered_for_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(MeshError, match=re.escape(says)):
        render_endpoint_picker(EXAMPLE_POLICY, dataclasses.replace(ENDPOINT_PICKER, **change))


def test_tenant_objectives_are_rendered_with_their_tiers_priority(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_POLICY.read_text())
    raw["tenants"] = {
        "defaults": {"tier": "standard"},
        "classes": {"gold": {"tier": "critical", "inference_objective": "gold-chat"}},
        "list": {"acme": "gold", "globex": "gold", "etl": {"tier": "sheddable",
                 "inference_objective": "etl-batch"}},
    }  # fmt: skip
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    for documents in (
        render_endpoint_picker(path, ENDPOINT_PICKER),
        render_envoy_gateway(path, ENVOY_GATEWAY),
    ):
        objectives = [d for d in documents if d["kind"] == "InferenceObjective"]
        assert {d["metadata"]["name"]: d["spec"]["priority"] for d in objectives} == {
            "slogate-critical": 10,
            "slogate-standard": 0,
            "slogate-sheddable": -10,
            "gold-chat": 10,
            "etl-batch": -10,
        }
        for document in objectives:
            jsonschema.validate(document, schema(document))


def test_the_picker_command_renders_the_committed_example_and_refuses_mixed_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make k8s`'s flags render deploy/k8s/slogate-endpoint-picker.yaml; a picker is not
    also a mesh filter, and TLS goes with the picker."""
    from tooling.cli.main import build_parser

    def k8s(*flags: str) -> int:
        args = build_parser().parse_args(["k8s", "--policy", str(EXAMPLE_POLICY), *flags])
        code: int = args.handler(args)
        return code

    picker = (
        "--endpoint-picker", "default=vllm-default", "--endpoint-picker", "long=vllm-long",
        "--pool-selector", "default=app=vllm-default", "--pool-selector", "long=app=vllm-long",
        "--tls-secret", "slogate-tls",
    )  # fmt: skip
    out = tmp_path / "picker.yaml"
    assert k8s(*picker, "--out", str(out)) == 0
    assert out.read_text() == (ROOT / "deploy" / "k8s" / "slogate-endpoint-picker.yaml").read_text()
    assert k8s(*picker, "--mesh", "istio") == 2
    assert "choose one" in capsys.readouterr().err
    assert k8s("--mesh", "istio", "--tls-secret", "s") == 2
    assert "--tls-secret goes with --endpoint-picker" in capsys.readouterr().err
    assert k8s(*picker, "--sidecar-listener", "loopback") == 2
    assert "--sidecar-listener is for the pod with its own Envoy" in capsys.readouterr().err
    assert k8s("--endpoint-picker", "default=p", "--out", str(out)) == 2
    assert "--pool-selector default=KEY=VALUE" in capsys.readouterr().err
