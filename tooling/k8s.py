"""Kubernetes manifests for one Envoy + slogate pod, rendered from a policy.

What lives here: `render_manifests`, which returns the documents (ConfigMap with the policy
and the generated Envoy bootstrap, a Secret for the Redis URL, the Deployment with both
containers, probes and resources, a Service, and a PodMonitor scraping every 15 s). The
bootstrap inside is the one `build_bootstrap` makes, with the client listener on 0.0.0.0
and the sidecar on loopback; tests validate it with the real Envoy binary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from policy import load_policy
from tooling.envoy_config import EnvoyPorts, build_bootstrap

LISTEN_PORT = 10000
ADMIN_PORT = 9901
SIDECAR_PORT = 50051
METRICS_PORT = 9464


def render_manifests(
    policy_path: Path,
    name: str = "slogate",
    image: str = "ghcr.io/slogate/slogate:0.1.0",
    envoy_image: str = "envoyproxy/envoy:v1.40.0",
    replicas: int = 2,
) -> list[dict[str, Any]]:
    policy = load_policy(policy_path)
    ports = EnvoyPorts(LISTEN_PORT, ADMIN_PORT, SIDECAR_PORT, "127.0.0.1", "0.0.0.0")
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
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-redis", "labels": labels},
        "type": "Opaque",
        # Replace with the real URL (redis://user:password@host:6379/0); the policy's
        # budget.redis_url is overridden by SLOGATE_REDIS_URL when set.
        "stringData": {"url": policy.budget.redis_url},
    }
    sidecar = {
        "name": "slogate",
        "image": image,
        "args": [
            "serve",
            "--policy",
            "/etc/slogate/policy.yaml",
            "--host",
            "127.0.0.1",
            "--grpc-port",
            str(SIDECAR_PORT),
            "--metrics-host",
            "0.0.0.0",
            "--metrics-port",
            str(METRICS_PORT),
        ],
        "env": [
            {
                "name": "SLOGATE_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": f"{name}-redis", "key": "url"}},
            }
        ],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        # grpc.health.v1 on the sidecar port (loopback inside the pod: probes run there).
        "readinessProbe": {"grpc": {"port": SIDECAR_PORT}, "periodSeconds": 5},
        "livenessProbe": {
            "grpc": {"port": SIDECAR_PORT},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"memory": "2Gi"},
        },
        "volumeMounts": [{"name": "config", "mountPath": "/etc/slogate", "readOnly": True}],
    }
    envoy = {
        "name": "envoy",
        "image": envoy_image,
        "args": ["-c", "/etc/slogate/envoy.json", "--concurrency", "2", "--log-level", "warn"],
        "ports": [{"name": "http", "containerPort": LISTEN_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": LISTEN_PORT},
            "periodSeconds": 5,
        },
        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/slogate", "readOnly": True}],
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
                    "containers": [envoy, sidecar],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
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
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "podMetricsEndpoints": [{"port": "metrics", "interval": "15s"}],
        },
    }
    return [config, secret, deployment, service, pod_monitor]


def write_manifests(policy_path: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    documents = render_manifests(policy_path)
    header = "# Generated by `slogate k8s` from the policy; do not edit by hand.\n"
    out.write_text(header + yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
