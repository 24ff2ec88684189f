"""Every manifest `slogate k8s` renders (the plain pod, Istio, Envoy Gateway; rendered now and
as committed) against Kubernetes' own schemas for each version supported, and the pod's
hardening: what the kubelet and the scheduler are told, not how a cluster enforces it.

Core kinds (ConfigMap, Deployment, PodDisruptionBudget, ...) are checked with
kubernetes-validate, which bundles the upstream OpenAPI schemas, in its strict mode (an
unknown field is an error, as `kubectl apply --validate=strict` makes it). Custom resources
are checked against the projects' vendored schemas (deploy/k8s/schemas), through the same
lookup tests/tooling/render/test_mesh.py uses. A document of a kind neither knows fails the
test: nothing is skipped unseen.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from extproc.service.admin_auth import TOKEN_FILE_ENV
from extproc.version import VERSION
from tests.support.stack import EXAMPLE_POLICY, ROOT
from tests.tooling.render.test_mesh import COMMITTED, SCHEMA_FILES, schema
from tooling.cli.main import build_parser
from tooling.render.k8s import (
    ADMIN_TOKEN_FILE,
    HEALTH_PORT,
    SIDECAR_PORT,
    SIDECAR_SOCKET,
    SIDECAR_UID,
    PodListener,
    render_manifests,
)

# The three newest minor versions kubernetes-validate 1.37 bundles (pyproject pins it).
SUPPORTED_VERSIONS = ("1.35", "1.36", "1.37")
K8S = ROOT / "deploy" / "k8s"
MANIFESTS = ("slogate.yaml", *sorted(COMMITTED))


def rendered(name: str) -> list[dict[str, Any]]:
    if name == "slogate.yaml":
        return render_manifests(EXAMPLE_POLICY)
    render, target, _ = COMMITTED[name]
    return render(EXAMPLE_POLICY, target)


def committed(name: str) -> list[dict[str, Any]]:
    return load(K8S / name)


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def validate(document: dict[str, Any], version: str) -> None:
    """Raises when the document does not meet its kind's schema at `version`."""
    if (document["apiVersion"], document["kind"]) in SCHEMA_FILES:
        jsonschema.validate(document, schema(document))
    else:
        kubernetes_validate.validate(document, version, strict=True)


SOURCES: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "rendered": rendered,
    "committed": committed,
}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("name", MANIFESTS)
def test_every_document_meets_its_schema(name: str, source: str, version: str) -> None:
    documents = SOURCES[source](name)
    assert {d["kind"] for d in documents} >= {"Deployment", "PodDisruptionBudget", "Service"}
    failures = []
    for document in documents:
        try:
            validate(document, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            where = ".".join(str(p) for p in error.path)
            name = f"{document['kind']} {document['metadata']['name']}"
            failures.append(f"{name}: {where}: {error.message}")
    assert not failures, "\n".join(failures)


def _deployment(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == "Deployment")


@pytest.mark.parametrize(
    "mutate",
    [
        # A misspelled field: only strict mode sees it (an API server only warns by default).
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
                {"readinesProbe": {"grpc": {"port": 1}}}
            )
        ),
        # Wrong types (the upstream schemas have no enums: a seccomp type they cannot check).
        (lambda d: d["spec"].update({"replicas": "two"})),
        (
            lambda d: d["spec"]["template"]["spec"]["securityContext"].update(
                {"runAsNonRoot": "yes"}
            )
        ),
    ],
)
def test_the_schemas_catch_a_broken_deployment(mutate: Callable[[dict[str, Any]], None]) -> None:
    deployment = copy.deepcopy(_deployment(render_manifests(EXAMPLE_POLICY)))
    validate(deployment, SUPPORTED_VERSIONS[0])
    mutate(deployment)
    for version in SUPPORTED_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(deployment, version)


def test_a_kind_no_schema_knows_fails() -> None:
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {}}, "1.37")


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_sidecar_pod_is_hardened_spread_and_budgeted(name: str) -> None:
    documents = rendered(name)
    deployment = _deployment(documents)
    labels = deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == SIDECAR_UID
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    writable = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert "readinessProbe" in container and "livenessProbe" in container
    sidecar = next(c for c in pod["containers"] if c["name"] == "slogate")
    assert sidecar["image"] == f"ghcr.io/slogate/slogate:{VERSION}"
    # The kubelet's gRPC probe dials the pod's IP: what it probes listens beyond loopback.
    probed = sidecar["readinessProbe"]["grpc"]["port"]
    assert probed == sidecar["livenessProbe"]["grpc"]["port"]
    args = sidecar["args"]
    # The health port on --health-host, else on --host, as the gRPC port.
    probed_host = "--health-host" if probed == HEALTH_PORT and "--health-host" in args else "--host"
    assert args[args.index(probed_host) + 1] == "0.0.0.0"
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    assert mounts["/tmp"] in writable and mounts["/var/log/slogate"] in writable
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": labels},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert pod["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": labels}
    budget = next(d for d in documents if d["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["selector"] == {"matchLabels": labels}
    assert budget["metadata"].get("namespace") == deployment["metadata"].get("namespace")
    assert budget["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_pod_makes_its_admin_token_and_only_the_sidecar_reads_it(name: str) -> None:
    """An init container writes the token into an in-memory emptyDir; the sidecar container
    alone mounts it (read-only) and names it in SLOGATE_ADMIN_TOKEN_FILE, which its CLI reads
    too; Envoy, on the same loopback, cannot read it."""
    pod = _deployment(rendered(name))["spec"]["template"]["spec"]
    (maker,) = pod["initContainers"]
    assert maker["args"] == ["admin-token", ADMIN_TOKEN_FILE]
    context = maker["securityContext"]
    assert context["runAsUser"] == SIDECAR_UID and context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    volume = next(v for v in pod["volumes"] if v["name"] == "admin-token")
    assert volume["emptyDir"]["medium"] == "Memory"
    for container in pod["containers"]:
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if container["name"] == "slogate":
            assert mounts["admin-token"]["readOnly"] is True
            assert env[TOKEN_FILE_ENV] == ADMIN_TOKEN_FILE
            assert ADMIN_TOKEN_FILE.startswith(mounts["admin-token"]["mountPath"] + "/")
        else:
            assert "admin-token" not in mounts and TOKEN_FILE_ENV not in env


def test_the_plain_pod_admits_only_envoy_and_metrics_from_outside() -> None:
    documents = render_manifests(EXAMPLE_POLICY)
    policy = next(d for d in documents if d["kind"] == "NetworkPolicy")["spec"]
    ports = sorted(p["port"] for rule in policy["ingress"] for p in rule["ports"])
    assert ports == [9464, 10000]  # not the sidecar's gRPC port
    assert all("from" not in rule for rule in policy["ingress"])


@pytest.mark.parametrize("listener", list(PodListener))
def test_in_the_plain_pod_only_health_and_metrics_are_on_the_pods_address(
    listener: PodListener,
) -> None:
    """Envoy reaches ext_proc and the access log inside the pod (the socket both containers
    mount, or loopback); the probes go to the health-only port on 0.0.0.0."""
    documents = render_manifests(EXAMPLE_POLICY, listener=listener)
    pod = _deployment(documents)["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    sidecar, envoy = containers["slogate"], containers["envoy"]
    args = sidecar["args"]
    parsed = build_parser().parse_args(args)  # flags `slogate serve` has
    assert parsed.health_port == HEALTH_PORT
    on_pod_address = {args[args.index(flag) + 1] for flag in ("--health-host", "--metrics-host")}
    assert on_pod_address == {"0.0.0.0"}
    assert "--host" not in args or args[args.index("--host") + 1] == "127.0.0.1"
    assert sidecar["readinessProbe"]["grpc"]["port"] == HEALTH_PORT
    assert {p["name"] for p in sidecar["ports"]} == {"health", "metrics"}
    config = next(d for d in documents if d["kind"] == "ConfigMap")
    bootstrap = yaml.safe_load(config["data"]["envoy.json"])
    cluster = next(
        c for c in bootstrap["staticResources"]["clusters"] if c["name"] == "slogate_sidecar"
    )
    address = cluster["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]
    if listener is PodListener.UNIX:
        assert args[args.index("--grpc-socket") + 1] == SIDECAR_SOCKET
        assert address == {"pipe": {"path": SIDECAR_SOCKET}}
        for container in (sidecar, envoy):  # the same emptyDir, at the socket's folder
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["sockets"] == str(Path(SIDECAR_SOCKET).parent)
    else:
        assert "--grpc-socket" not in args
        assert address == {"socketAddress": {"address": "127.0.0.1", "portValue": SIDECAR_PORT}}


def test_the_image_flag_names_another_image(tmp_path: Path) -> None:
    out = tmp_path / "k8s.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooling.cli.main",
            "k8s",
            "--policy",
            str(EXAMPLE_POLICY),
            "--out",
            str(out),
            "--image",
            "registry.example/slogate:test",
            "--replicas",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    deployment = _deployment(load(out))
    assert deployment["spec"]["replicas"] == 3
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert "registry.example/slogate:test" in images


# --- kustomize: the plain manifest as a base ------------------------------------------------


def test_the_kustomization_lists_the_plain_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"] == ["slogate.yaml"]
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    # A base leaves the namespace to the overlay: no document names one.
    assert all("namespace" not in d["metadata"] for d in committed("slogate.yaml"))


def test_kubectl_kustomize_builds_the_base() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client)")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(done.stdout) if d}
    assert built == {(d["kind"], d["metadata"]["name"]) for d in committed("slogate.yaml")}
