"""Kubernetes manifests for one Envoy + slogate pod, rendered from a policy.

What lives here: `render_manifests`, which returns the documents (ConfigMap with the policy
and the generated Envoy bootstrap, a Secret for the Redis URL, the Deployment with both
containers, probes and resources, a Service, a NetworkPolicy, a PodDisruptionBudget and a
PodMonitor scraping every 15 s), and the pieces the mesh manifests share with it (the
sidecar container, the pod's hardening, the disruption budget). The bootstrap inside is the
one `build_bootstrap` makes, with the client listener on 0.0.0.0; tests validate it with the
real Envoy binary, and every document against Kubernetes' own schemas
(tests/tooling/render/test_k8s.py).

In the pod, ext_proc and the access log are reachable from the pod alone (`PodListener`: a
Unix socket in an emptyDir both containers mount, Envoy's pipe address, by default; or
127.0.0.1), so nobody outside can report usage to the sidecar whatever the cluster's network
plugin enforces. The kubelet's gRPC probe dials the pod's IP (a probe has no host field): it
reaches a health-only port (`serve --health-host 0.0.0.0 --health-port`, grpc.health.v1 and
nothing else), and Prometheus /metrics. The NetworkPolicy admits Envoy's listener and
/metrics from outside the pod (the node's own traffic, the kubelet's probes, always passes).

The admin API stays on loopback, which every container of the pod shares, so its changes
(drills, reloads, drains, keys) need a token: an init container (`slogate admin-token`)
writes a random one into an in-memory emptyDir that only the sidecar container mounts, and
SLOGATE_ADMIN_TOKEN_FILE names it there, for the sidecar and for the CLI run by `kubectl
exec` in that container. Chosen over a Secret so that `kubectl apply` of these files works
as they are, with no token in them (the committed manifests are public) and no step before:
whoever may exec into the sidecar container may read the token, the same people who can
reach loopback at all. One token for every pod, kept in a Secret, is documented in
docs/operators/admin-api.md.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from extproc.service.admin_auth import TOKEN_FILE_ENV
from extproc.version import VERSION
from policy.loader import load_policy
from policy.schema import Policy
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import EnvoyPorts

LISTEN_PORT = 10000
ADMIN_PORT = 9901
SIDECAR_PORT = 50051
METRICS_PORT = 9464
# grpc.health.v1 alone, in plain text, where the kubelet's gRPC probe can dial it: on the
# pod's address while ext_proc stays inside the pod, or beside a TLS gRPC port (the probe
# speaks no TLS). `serve --health-port`; the port llm-d's endpoint picker uses for the same.
HEALTH_PORT = 9003
SOCKET_DIR = "/var/run/slogate"  # an emptyDir both containers mount
SIDECAR_SOCKET = f"{SOCKET_DIR}/grpc.sock"


class PodListener(StrEnum):
    """How the pod's Envoy reaches ext_proc and the access log (`slogate k8s
    --sidecar-listener`); either way nothing outside the pod can."""

    UNIX = "unix"  # `serve --grpc-socket`: a file only the pod's containers see
    LOOPBACK = "loopback"  # 127.0.0.1: shared by every container of the pod


# `slogate bench listeners` (bench/results/listeners*.md) measured no difference in the
# sidecar's CPU per request beyond a loaded machine's noise: a round's socket / TCP ratio
# 0.86-1.33 (median 1.06) in one run, 0.63-1.52 (median 0.87) in another, more loaded
# (Python's ~1 ms a request hides the kernel's few µs). The tie goes to the socket: it
# reaches only the containers that mount it, loopback every container of the pod.
DEFAULT_POD_LISTENER = PodListener.UNIX
TLS_DIR = "/etc/slogate/tls"  # a kubernetes.io/tls Secret: tls.crt, tls.key (and ca.crt)
# The admin token: made at each pod's start by an init container (`slogate admin-token`)
# into an in-memory emptyDir only the sidecar container mounts (module docstring).
ADMIN_TOKEN_DIR = "/var/run/slogate-admin"  # apart from SOCKET_DIR, which Envoy mounts
ADMIN_TOKEN_FILE = f"{ADMIN_TOKEN_DIR}/token"
# The image this version builds: the tag is the package's own version (extproc/version.py).
DEFAULT_IMAGE = f"ghcr.io/slogate/slogate:{VERSION}"
DEFAULT_ENVOY_IMAGE = "envoyproxy/envoy:v1.40.0"
# The sidecar image's non-root user; Envoy's image has its own (`envoy`, 101).
SIDECAR_UID = 10001
ENVOY_UID = 101


def render_manifests(
    policy_path: Path,
    name: str = "slogate",
    image: str = DEFAULT_IMAGE,
    envoy_image: str = DEFAULT_ENVOY_IMAGE,
    replicas: int = 2,
    listener: PodListener = DEFAULT_POD_LISTENER,
) -> list[dict[str, Any]]:
    policy = load_policy(policy_path)
    socket = SIDECAR_SOCKET if listener is PodListener.UNIX else None
    ports = EnvoyPorts(
        LISTEN_PORT, ADMIN_PORT, SIDECAR_PORT, "127.0.0.1", "0.0.0.0", sidecar_socket=socket
    )
    bootstrap = build_bootstrap(policy, ports)
    labels = {"app.kubernetes.io/name": name}
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "labels": labels},
        "data": {
            "policy.yaml": policy_path.read_text(encoding="utf-8"),
            "envoy.json": json.dumps(bootstrap, indent=1),
        },
    }
    secret = redis_secret(policy, name, labels)
    sidecar = sidecar_container(name, image, listener=listener)
    envoy_mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": "/etc/slogate", "readOnly": True}
    ]
    if listener is PodListener.UNIX:
        envoy_mounts.append(dict(SOCKETS_MOUNT))
    envoy = {
        "name": "envoy",
        "image": envoy_image,
        # No hot restart: in a pod a restart is a new container, with nothing to hand over.
        "args": [
            "-c",
            "/etc/slogate/envoy.json",
            "--concurrency",
            "2",
            "--log-level",
            "warn",
            "--disable-hot-restart",
        ],
        "ports": [{"name": "http", "containerPort": LISTEN_PORT}],
        # /health is forwarded to the default pool (failure mode open): ready when it answers.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": LISTEN_PORT},
            "periodSeconds": 5,
        },
        # Alive while its listener accepts; an engine outage must not restart Envoy.
        "livenessProbe": {"tcpSocket": {"port": LISTEN_PORT}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": container_security(ENVOY_UID),
        "volumeMounts": envoy_mounts,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    **pod_hardening(labels),
                    "initContainers": [admin_token_maker(image)],
                    "containers": [envoy, sidecar],
                    "volumes": sidecar_volumes(name, sockets=listener is PodListener.UNIX),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": 80, "targetPort": LISTEN_PORT}],
        },
    }
    network = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            # Envoy's listener and /metrics; ext_proc and the access log are not on the pod's
            # address at all, the health port needs no rule (the kubelet's traffic passes).
            "ingress": [
                {"ports": [{"port": LISTEN_PORT, "protocol": "TCP"}]},
                {"ports": [{"port": METRICS_PORT, "protocol": "TCP"}]},
            ],
        },
    }
    budget = disruption_budget(name, labels)
    pod_monitor = monitor(name, labels)
    return [config, secret, deployment, service, network, budget, pod_monitor]


class _NoAliases(yaml.SafeDumper):
    """Every shared dict written out in full: manifests read without YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write_documents(documents: list[dict[str, Any]], out: Path, command: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Generated by `{command}` from the policy; do not edit by hand.\n"
    text = yaml.dump_all(documents, Dumper=_NoAliases, sort_keys=False)
    out.write_text(header + text, encoding="utf-8")


def write_manifests(
    policy_path: Path,
    out: Path,
    image: str = DEFAULT_IMAGE,
    replicas: int = 2,
    listener: PodListener = DEFAULT_POD_LISTENER,
) -> None:
    write_documents(
        render_manifests(policy_path, image=image, replicas=replicas, listener=listener),
        out,
        "slogate k8s",
    )


SOCKETS_MOUNT: dict[str, Any] = {"name": "sockets", "mountPath": SOCKET_DIR}


def sidecar_container(
    name: str,
    image: str,
    tls_secret: str | None = None,
    mutual_tls: bool = False,
    listener: PodListener | None = None,
) -> dict[str, Any]:
    """The `slogate serve` container, with a read-only root filesystem and the writable
    paths the sidecar uses as emptyDirs (`sidecar_volumes`). With `listener` (Envoy in the
    same pod) ext_proc and the access log stay inside the pod (a Unix socket in the
    `sockets` emptyDir, or loopback) and the pod's address serves only the health port and
    /metrics; without, a mesh's Envoys call it over the network on 0.0.0.0. With
    `tls_secret` (a kubernetes.io/tls Secret, `sidecar_volumes` mounts it) the gRPC port
    speaks TLS (and asks callers for a certificate its ca.crt signed, with `mutual_tls`).
    The probes go to the plain-text health port wherever it exists."""
    if listener is None:
        grpc = ["--host", "0.0.0.0", "--grpc-port", str(SIDECAR_PORT)]
    elif listener is PodListener.UNIX:
        grpc = ["--grpc-socket", SIDECAR_SOCKET]
    else:
        grpc = ["--host", "127.0.0.1", "--grpc-port", str(SIDECAR_PORT)]
    args = [
        "serve",
        "--policy",
        "/etc/slogate/policy.yaml",
        *grpc,
        "--metrics-host",
        "0.0.0.0",
        "--metrics-port",
        str(METRICS_PORT),
    ]
    ports = [{"name": "metrics", "containerPort": METRICS_PORT}]
    if listener is None:
        ports.insert(0, {"name": "grpc", "containerPort": SIDECAR_PORT})
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": "/etc/slogate", "readOnly": True},
        *({"name": volume, "mountPath": path} for volume, path in WRITABLE_PATHS.items()),
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
    ]
    if listener is PodListener.UNIX:
        mounts.append(dict(SOCKETS_MOUNT))
    probe_port = SIDECAR_PORT
    if tls_secret is not None:
        args += ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]
        if mutual_tls:
            args += ["--tls-client-ca", f"{TLS_DIR}/ca.crt"]
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if tls_secret is not None or listener is not None:
        # The kubelet's probe speaks no TLS and dials the pod's address: grpc.health.v1
        # alone there, in plain text.
        args += ["--health-port", str(HEALTH_PORT)]
        if listener is not None:
            args += ["--health-host", "0.0.0.0"]
        ports.append({"name": "health", "containerPort": HEALTH_PORT})
        probe_port = HEALTH_PORT
    return {
        "name": "slogate",
        "image": image,
        "args": args,
        "env": [
            {
                "name": "SLOGATE_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": f"{name}-redis", "key": "url"}},
            },
            # Read by the sidecar (its admin API's token) and by `kubectl exec ... slogate
            # drill` in this container (the CLI sends it): nothing to type.
            {"name": TOKEN_FILE_ENV, "value": ADMIN_TOKEN_FILE},
        ],
        "ports": ports,
        # grpc.health.v1 (Kubernetes' own gRPC probe, GA since 1.27), by the endpoint picker
        # protocol's service names: a draining sidecar is not ready but alive (not restarted).
        "readinessProbe": {
            "grpc": {"port": probe_port, "service": "readiness"},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "grpc": {"port": probe_port, "service": "liveness"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"memory": "2Gi"},
        },
        "securityContext": container_security(SIDECAR_UID),
        "volumeMounts": mounts,
    }


# What the sidecar writes, each an emptyDir under a read-only root filesystem: /tmp
# (`serve --workers`' sockets, Python's temporary files) and /var/log/slogate, the decision
# log's folder in deploy/policy.example.yaml (a traffic record's `dir` can go there too).
WRITABLE_PATHS = {"tmp": "/tmp", "logs": "/var/log/slogate"}


def sidecar_volumes(
    name: str, tls_secret: str | None = None, sockets: bool = False
) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "logs", "emptyDir": {}},
        {"name": "admin-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    if sockets:
        # The sidecar's Unix socket, shared with Envoy: the pod's fsGroup (the sidecar's
        # group) owns it, and Envoy's user is in that group, so the socket's 0660 lets it
        # connect.
        volumes.append({"name": "sockets", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    if tls_secret is not None:  # made by the operator (cert-manager writes this shape)
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret}})
    return volumes


def admin_token_maker(image: str) -> dict[str, Any]:
    """The init container that makes the pod's admin token (random, 0600, owned by the
    sidecar's user) before the sidecar starts; it runs once per pod, so a restarted sidecar
    container keeps the token (the emptyDir outlives it)."""
    return {
        "name": "admin-token",
        "image": image,
        "args": ["admin-token", ADMIN_TOKEN_FILE],
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": container_security(SIDECAR_UID),
        "volumeMounts": [{"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR}],
    }


def container_security(uid: int) -> dict[str, Any]:
    """Non-root, no privilege escalation, no Linux capabilities, nothing written outside
    the mounted emptyDirs: what the restricted Pod Security Standard asks, and more."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_hardening(labels: dict[str, str]) -> dict[str, Any]:
    """The pod-level half: non-root with the runtime's default seccomp profile, no API token
    (the sidecar never calls the Kubernetes API), replicas spread over nodes and zones
    where the scheduler can (preferred, so a small cluster still schedules them)."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_UID,
            "fsGroup": SIDECAR_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": labels},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": labels},
            }
        ],
    }


def disruption_budget(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """At most one replica drained at a time: with maxUnavailable (not minAvailable) a
    single replica can still be drained, and two or more keep all but one serving."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }


def redis_secret(policy: Policy, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-redis", "labels": labels},
        "type": "Opaque",
        # Replace with the real URL (redis://user:password@host:6379/0); the policy's
        # budget.redis_url is overridden by SLOGATE_REDIS_URL when set.
        "stringData": {"url": policy.budget.redis_url},
    }


def monitor(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "podMetricsEndpoints": [{"port": "metrics", "interval": "15s"}],
        },
    }
