"""The Envoy configuration `slogate k8s --mesh istio|envoy-gateway` makes, run by the real
Envoy where it can be assembled here: Istio's patches applied as istiod applies them
(tests/support/istio.py) to a gateway-shaped configuration, with the real sidecar and pools
behind it; Envoy Gateway's JSON patches applied to a listener shaped as Envoy Gateway
translates its policies. The manifests themselves: tests/tooling/render/test_mesh.py."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.request.contract import (
    EXT_PROC_FILTER,
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
)
from policy.loader import load_policy
from policy.schema import Policy
from tests.support import istio
from tests.support.http import CHAT, chat_body, post
from tests.support.mesh import ENVOY_GATEWAY, ISTIO, SERVICES, by_kind, ms
from tests.support.stack import EXAMPLE_POLICY, random_ports
from tooling.render.envoy_config.filters import (
    ext_proc_filter,
    max_message_timeout_ms,
    router_filter,
)
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.render.k8s import SIDECAR_PORT
from tooling.render.mesh import render_istio
from tooling.render.mesh_gateway import _snake, eg_names, render_envoy_gateway
from tooling.stack.local import LocalStack
from tooling.stack.processes import envoy_binary


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
    assert ms(ext_proc["max_message_timeout"]) == max_message_timeout_ms(policy)
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
