"""`slogate k8s --mesh istio|envoy-gateway`: the manifests are valid against the projects'
published CRD schemas (deploy/k8s/schemas), the committed ones are what the code renders,
and the Envoy configuration they make is run by the real Envoy where it can be assembled
here: Istio's patches applied as istiod applies them (tests/support/istio.py) to a
gateway-shaped configuration, with the real sidecar and pools behind it; Envoy Gateway's
JSON patches applied to a listener shaped as Envoy Gateway translates its policies."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extproc.request.contract import (
    EXT_PROC_FILTER,
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
    POOL_HEADER,
    SIDECAR_SET_HEADERS,
)
from extproc.service.replies import WAIT_REPLY_MARGIN_MS, wait_reply_ms
from policy import Policy, load_policy
from tests.support import istio
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, ROOT, random_ports
from tooling.render.envoy_config import EnvoyPorts
from tooling.render.envoy_config.filters import (
    ext_proc_filter,
    max_message_timeout_ms,
    router_filter,
)
from tooling.render.k8s import SIDECAR_PORT, write_documents
from tooling.render.mesh import MeshError, MeshTarget, render_istio
from tooling.render.mesh_gateway import _snake, eg_names, render_envoy_gateway
from tooling.stack.local import LocalStack
from tooling.stack.processes import envoy_binary

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
SERVICES = {
    "default": ("vllm-default", 8000),
    "long": ("vllm-long", 8000),
    "fallback": ("vllm-fallback", 8000),
}
# What the committed examples are rendered with (`make k8s`).
ISTIO = MeshTarget(pool_services=SERVICES, skip_routes=("status",))
ENVOY_GATEWAY = MeshTarget(
    pool_services={k: v for k, v in SERVICES.items() if k != "long"},
    inference_pools={"long": "long-context"},
)
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


def by_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind)


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


def _ms(duration: str) -> int:
    return round(float(duration.removesuffix("s")) * 1000)


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
    assert [_ms(v) for v in _values(envoy_filter, "maxMessageTimeout")] == [wanted]
    patches = by_kind(render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY), "EnvoyPatchPolicy")
    operations = [p["operation"] for p in patches["spec"]["jsonPatches"]]
    values = [o["value"] for o in operations if o["path"].endswith("/max_message_timeout")]
    assert [_ms(v) for v in values] == [wanted]
    # An Envoy Gateway idle timer outlasts it too (ClientTrafficPolicy).
    client = by_kind(render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY), "ClientTrafficPolicy")
    assert _ms(client["spec"]["timeout"]["http"]["streamIdleTimeout"]) > wanted


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


def istio_gateway(policy: Policy, ports: EnvoyPorts) -> dict[str, Any]:
    target = ISTIO
    clusters = {
        f"outbound|{port}||{target.host(service)}": (policy.pools[pool].endpoints[0][1], False)
        for pool, (service, port) in SERVICES.items()
    }
    clusters[f"outbound|{SIDECAR_PORT}||{target.host(target.name)}"] = (ports.sidecar_port, True)
    base = istio.gateway_bootstrap(
        ports.listen_port,
        ports.admin_port,
        target.port,
        clusters,
        default_cluster=f"outbound|8000||{target.host('vllm-default')}",
    )
    envoy_filter = by_kind(render_istio(EXAMPLE_POLICY, target), "EnvoyFilter")
    return istio.apply_envoy_filter(base, envoy_filter["spec"])


@pytest.fixture(scope="module")
def istio_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = tmp_path_factory.mktemp("istio")
    stack = LocalStack(
        EXAMPLE_POLICY, work, random_ports(), time_scale=0.05, bootstrap=istio_gateway
    )
    stack.start()
    try:
        yield stack
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


@pytest.mark.e2e
def test_an_istio_gateway_with_the_envoy_filter_routes_by_context(istio_stack: LocalStack) -> None:
    stack = istio_stack
    short = post(stack.url, CHAT, chat_body("hello", max_tokens=8), headers={OBJECTIVE_HEADER: "x"})
    assert short.status == 200, short.body
    assert short.headers["x-sim-pool"] == short.headers["x-slogate-pool"] == "default"
    saw = json.loads(short.headers["x-sim-saw-headers"])
    assert saw[OBJECTIVE_HEADER] == "slogate-standard" and saw[FAIRNESS_HEADER] == "demo-standard"
    long = post(stack.url, CHAT, chat_body(" word" * 40_000, max_tokens=16))
    assert long.status == 200 and long.headers["x-sim-pool"] == "long", long.body
    assert "x-ratelimit-remaining-requests" in long.headers  # rendered from metadata
    # Their route that serves no policy path skips the sidecar (--skip-route status) ...
    status = post(stack.url, "/status", b"", key=None)
    assert status.status == 200 and status.body == b"ok"
    # ... while their /v1/ route gets the sidecar's default deny for what it does not list.
    unknown = post(stack.url, "/v1/fine_tuning/jobs", chat_body())
    assert unknown.status == 404 and unknown.headers["x-slogate-reason"] == "unknown_path"


# --- Envoy Gateway: the JSON patches on a listener shaped as Envoy Gateway makes it -------


def _add(document: Any, pointer: str, value: Any) -> None:
    """RFC 6902 `add` at a JSON pointer (members, array indexes and `-`)."""
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]
    for part in parents:
        document = document[int(part)] if isinstance(document, list) else document[part]
    if isinstance(document, list):
        document.insert(len(document) if last == "-" else int(last), copy.deepcopy(value))
    else:
        document[last] = copy.deepcopy(value)


def _select(document: Any, json_path: str) -> list[Any]:
    """The one RFC 9535 form the patches use: `$.a.b[0].c[?@.name=='x']`."""
    match = re.fullmatch(r"\$\.(.+)\[\?@\.name=='([^']+)'\]", json_path)
    assert match is not None, json_path
    node = document
    for part in re.findall(r"[^.\[\]]+", match.group(1)):
        node = node[int(part)] if part.isdigit() else node[part]
    return [item for item in node if item.get("name") == match.group(2)]


def envoy_gateway_listener(policy: Policy) -> dict[str, Any]:
    """A listener as Envoy Gateway v1.9 translates the EnvoyExtensionPolicy (its filter
    names, snake_case as its JSON patches see it, ext_proc disabled and switched on per
    route), with slogate's ext_proc settings where Envoy Gateway would set its own."""
    names = eg_names(ENVOY_GATEWAY)
    ext_proc = ext_proc_filter(policy, cluster=names["ext_proc_cluster"]).to_dict(casing=_snake())
    ext_proc["name"] = names["ext_proc_filter"]
    ext_proc["disabled"] = True
    for unset in ("max_message_timeout", "status_on_error"):
        ext_proc["typed_config"].pop(unset, None)
    ext_proc["typed_config"]["grpc_service"]["envoy_grpc"].pop("max_receive_message_length")
    router = router_filter().to_dict(casing=_snake())
    manager = {
        "@type": istio.HCM_TYPE,
        "stat_prefix": "http-10080",
        "access_log": [],
        "http_filters": [ext_proc, router],
        "rds": {"route_config_name": names["route_configuration"], "config_source": {"ads": {}}},
    }
    return {
        "name": names["listener"],
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10080}},
        "default_filter_chain": {
            "filters": [
                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
            ]
        },
    }


@pytest.mark.e2e
def test_envoy_gateways_patches_apply_and_the_real_envoy_accepts_them(tmp_path: Path) -> None:
    policy = load_policy(EXAMPLE_POLICY)
    listener = envoy_gateway_listener(policy)
    patch_policy = by_kind(render_envoy_gateway(EXAMPLE_POLICY, ENVOY_GATEWAY), "EnvoyPatchPolicy")
    patches = patch_policy["spec"]["jsonPatches"]
    # The engines' clusters Envoy Gateway makes for each Service-backed pool rule (the long
    # pool's InferencePool picks its own): picking, health checks, outlier detection.
    engines: dict[str, dict[str, Any]] = {}
    for patch in patches:
        if patch["type"].endswith("Cluster"):
            cluster = engines.setdefault(patch["name"], istio.cluster(patch["name"], 8000))
            _add(cluster, patch["operation"]["path"], patch["operation"]["value"])
    assert set(engines) == {
        "httproute/llm/slogate-pools/rule/0",
        "httproute/llm/slogate-pools/rule/2",
    }
    for cluster in engines.values():
        assert cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"][
            "name"
        ] == ("envoy.load_balancing_policies.override_host")
        assert cluster["health_checks"][0]["http_health_check"]["path"] == "/health"
    for patch in [p for p in patches if p["type"].endswith("Listener")]:
        assert patch["name"] == listener["name"]
        operation = patch["operation"]
        targets = (
            _select(listener, operation["jsonPath"]) if "jsonPath" in operation else [listener]
        )
        assert targets, operation  # every patch finds what it patches
        for target in targets:
            _add(target, operation["path"], operation["value"])
    manager = listener["default_filter_chain"]["filters"][0]["typed_config"]
    assert manager["access_log"][0]["typed_config"]["common_config"]["log_name"] == "slogate"
    ext_proc = manager["http_filters"][0]["typed_config"]
    assert _ms(ext_proc["max_message_timeout"]) == max_message_timeout_ms(policy)
    # Static stand-ins for what Envoy Gateway sends by xDS: the routes and the cluster.
    manager.pop("rds")
    names = eg_names(ENVOY_GATEWAY)
    enabled = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}
    route = {
        "match": {"prefix": "/"},
        "route": {"cluster": names["ext_proc_cluster"]},
        "typed_per_filter_config": {names["ext_proc_filter"]: enabled},
    }
    manager["route_config"] = {
        "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [route]}]
    }
    bootstrap = {
        "static_resources": {
            "listeners": [listener],
            "clusters": [
                istio.cluster(
                    eg_names(ENVOY_GATEWAY)["ext_proc_cluster"], SIDECAR_PORT, http2=True
                ),
                *engines.values(),
            ],
        }
    }
    path = tmp_path / "eg.json"
    path.write_text(json.dumps(bootstrap))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert EXT_PROC_FILTER not in json.dumps(bootstrap)  # Envoy Gateway names its own
