"""Deployment artefacts run for real: the alert rules and their unit tests under promtool
(and the tests catch a weakened rule), the Kubernetes manifests current and their Envoy
configuration accepted by the real Envoy, and the sidecar's gRPC health checks.
The metrics catalogue against the code: tests/deploy/test_deploy.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.stack import ROOT

RULES = ROOT / "deploy" / "prometheus" / "slogate-rules.yaml"

RULE_TESTS = ROOT / "deploy" / "prometheus" / "slogate-rules.test.yaml"


# The monthly L3 reminder's tests, evaluated hourly: 40 days at a minute take too long.
MONTHLY_TESTS = ROOT / "deploy" / "prometheus" / "slogate-rules.monthly.test.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make test` installs Debian's prometheus package"
    return found


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_alert_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = run("check", "rules", RULES.name, cwd=RULES.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = run("test", "rules", RULE_TESTS.name, MONTHLY_TESTS.name, cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize(
    ("original", "weakened"),
    [
        ("> 0.01\n", "> 0.05\n"),  # 5xx threshold
        ("for: 2m", "for: 20m"),  # KV cache hold time
        ("slogate_redis_up == 0", "slogate_redis_up == 2"),
        ("> 0.10\n", "> 0.30\n"),  # pool-full refusal share
        ("correlation:30m < 0.7", "correlation:30m < -1.5"),  # KV hit rate decoupled
        (">= 0.02)", ">= 0)"),  # the variance guard: a flat pool would get a correlation
        ("[31d])) < 3", "[3d])) < 3"),  # the monthly L3 reminder
        ("[1d] offset 30d", "[1d] offset 1d"),  # ... quiet in a deployment's first month
    ],
)
def test_rule_tests_catch_a_weakened_rule(tmp_path: Path, original: str, weakened: str) -> None:
    text = RULES.read_text()
    assert original in text
    (tmp_path / RULES.name).write_text(text.replace(original, weakened, 1))
    for tests in (RULE_TESTS, MONTHLY_TESTS):
        shutil.copy(tests, tmp_path / tests.name)
    tested = run("test", "rules", RULE_TESTS.name, MONTHLY_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0


def test_k8s_manifests_are_current_and_their_envoy_config_is_valid(tmp_path: Path) -> None:
    import json

    import yaml

    from policy.loader import parse_policy
    from tooling.render.k8s import render_manifests
    from tooling.stack.processes import envoy_binary

    committed = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "slogate.yaml").read_text()))
    assert committed == render_manifests(ROOT / "deploy" / "policy.example.yaml"), (
        "run `slogate k8s`"
    )
    kinds = {d["kind"]: d for d in committed}
    assert set(kinds) == {
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
    }
    pod = kinds["Deployment"]["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    sidecar = containers["slogate"]
    assert sidecar["readinessProbe"]["grpc"]["port"] == 9003  # the health-only port
    assert sidecar["livenessProbe"]["grpc"]["port"] == 9003
    assert sidecar["resources"]["requests"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    interval = kinds["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["interval"]
    assert int(interval.rstrip("s")) <= 15
    assert sidecar["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "slogate-redis"
    data = kinds["ConfigMap"]["data"]
    parse_policy(yaml.safe_load(data["policy.yaml"]))  # the embedded policy is valid
    bootstrap = json.loads(data["envoy.json"])
    listener = bootstrap["staticResources"]["listeners"][0]["address"]["socketAddress"]
    assert listener["address"] == "0.0.0.0"
    (tmp_path / "envoy.json").write_text(data["envoy.json"])
    # The Envoy container's own arguments, its config path pointed here: flags checked too.
    args = [
        str(tmp_path / "envoy.json") if a.endswith("envoy.json") else a
        for a in containers["envoy"]["args"]
    ]
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sidecar_answers_grpc_health_checks(tmp_path: Path) -> None:
    import asyncio

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tooling.stack.processes import start_sidecar

    proc, ports = start_sidecar(tmp_path, ROOT / "deploy" / "policy.example.yaml")
    try:
        port = ports.grpc

        async def check() -> int:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="")
                )
                return int(reply.status)

        assert asyncio.run(check()) == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.stop()
