"""The sidecar's container image (Containerfile, tooling/build/image.py), built here without a
registry: it starts with a mounted policy, reports healthy by its own HEALTHCHECK, and decides
for a real Envoy outside it, in front of the simulated pools, as the sidecar process does.

Marked `image` (`make test` runs these after the rest): the first build here makes the
Debian base and the wheels (~75 s); a rebuild with both cached takes ~10 s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.runtime.processes import ManagedProcess
from tests.extproc.runtime.test_supervisor import write_policy
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, charged_as_used, random_ports
from tooling.build import image
from tooling.stack.local import LocalStack, Replica
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis

pytestmark = pytest.mark.image
IMAGE_USER = 10001  # the Containerfile's USER
MAX_SIZE_MB = 450  # measured 407 MB on the Debian base; Envoy's binary back would add ~107 MB


def podman(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env=image.podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def built() -> str:
    if shutil.which("podman") is None or shutil.which("mmdebstrap") is None:
        message = "podman and mmdebstrap are needed: `make podman` installs them"
        if os.environ.get("SLOGATE_REQUIRE_IMAGE") == "1":  # make test: a failure
            pytest.fail(message)
        pytest.skip(message)
    started = time.monotonic()
    tag = image.build_image()
    print(f"image {tag} built in {time.monotonic() - started:.0f} s")
    return tag


@dataclasses.dataclass
class ContainerStack(LocalStack):
    """The local stack whose sidecar is the image, run with podman on the host's network."""

    image_tag: str = ""
    containers: list[str] = dataclasses.field(default_factory=list)

    def start_sidecar(self, replica: Replica) -> None:
        assert self.sidecar_policy_path is not None
        self.sidecar_policy_path.chmod(0o644)  # the image's user reads it through the mount
        grpc_port, metrics_port, admin_port = free_port(), free_port(), free_port()
        name = f"slogate-test-{os.getpid()}-{grpc_port}"
        argv = [
            "podman", "run", "--rm", "--name", name, "--runtime", "runc", "--network", "host",
            # The image's HEALTHCHECK is run by `podman healthcheck run` below (podman's
            # timer needs systemd, which these machines do not run).
            "--health-interval", "disable",
            # As deploy/k8s runs it: a read-only root, /tmp writable, no capabilities.
            "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "-e", f"SLOGATE_HEALTH_ADDRESS=127.0.0.1:{grpc_port}",
            "-v", f"{self.sidecar_policy_path}:/etc/slogate/policy.yaml:ro",
            self.image_tag,
            "serve", "--policy", "/etc/slogate/policy.yaml", "--host", "127.0.0.1",
            "--grpc-port", str(grpc_port), "--metrics-host", "127.0.0.1",
            "--metrics-port", str(metrics_port), "--admin-address", f"127.0.0.1:{admin_port}",
        ]  # fmt: skip
        conf = {"CONTAINERS_CONF": image.podman_env()["CONTAINERS_CONF"]}
        proc = ManagedProcess("container", argv, self.work_dir, conf).start()
        self.containers.append(name)
        self.processes.append(proc)
        deadline = time.monotonic() + 120
        while podman("healthcheck", "run", name).returncode != 0:
            assert proc.running(), proc.log_text()
            assert time.monotonic() < deadline, f"never healthy:\n{proc.log_text()}"
            time.sleep(0.5)
        replica.sidecar, self.sidecar = proc, proc
        replica.grpc_port, replica.metrics_port = grpc_port, metrics_port
        replica.admin_address = f"127.0.0.1:{admin_port}"

    def stop(self) -> None:
        super().stop()
        for name in self.containers:
            podman("rm", "-f", "--ignore", name)


@pytest.fixture(scope="module")
def stack(built: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerStack]:
    work = tmp_path_factory.mktemp("image-stack")
    running = ContainerStack(EXAMPLE_POLICY, work, random_ports(), time_scale=0.05, image_tag=built)
    running.start()
    yield running
    running.stop()


def test_the_container_is_healthy_and_not_root(stack: ContainerStack) -> None:
    name = stack.containers[0]
    health = podman("inspect", "--format", "{{.State.Health.Status}}", name)
    assert health.stdout.strip() == "healthy", health
    user = podman("exec", name, "id", "-u")
    assert user.returncode == 0 and int(user.stdout) == IMAGE_USER, user
    # Its log is the container's output: the sidecar's lines reach `podman logs`.
    assert "slogate sidecar ready: grpc" in podman("logs", name).stdout


def test_an_admitted_request_reaches_the_pool_with_slogates_headers(
    stack: ContainerStack,
) -> None:
    reply = post(stack.url, CHAT, chat_body("What is the capital of France?"))
    assert reply.status == 200, reply.body
    assert reply.headers["x-slogate-pool"] == reply.headers["x-sim-pool"] == "default"
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    assert saw["x-slogate-tenant"] == "demo-standard" and saw["x-slogate-bucket"] == "0-4k"
    charged_as_used(stack)  # Envoy's access log reaches the container and settles usage


def test_refusals_are_openai_errors(stack: ContainerStack) -> None:
    anonymous = post(stack.url, CHAT, chat_body("hi"), key=None)
    assert anonymous.status == 401, anonymous.body
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    statuses = []
    for _ in range(8):  # sk-demo-small: 5 requests a minute
        reply = post(stack.url, CHAT, chat_body("hi", max_tokens=4), key="sk-demo-small")
        statuses.append(reply.status)
        if reply.status == 429:
            break
    assert statuses[-1] == 429, statuses
    assert reply.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(reply.headers["retry-after"]) >= 1


def test_simulate_runs_from_the_image(built: str) -> None:
    done = podman(
        "run", "--rm", "--runtime", "runc", "--network", "none", "--health-interval", "disable",
        built, "simulate", "--duration-s", "2", "--out-dir", "/tmp/out",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote /tmp/out/simulate-" in done.stdout


def test_the_image_holds_the_venv_alone(built: str) -> None:
    """Nothing of the build (the sources, pip, setuptools), the tests or Envoy's binary."""
    script = (
        "cd /opt/slogate/lib/python3*/site-packages && "
        "for gone in /src /dist /opt/slogate/bin/pip /opt/slogate/bin/envoy pip setuptools "
        "tests envoy/_bin pytest; do test -e $gone && echo present: $gone; done; "
        "command -v gcc cc make; python -c 'import tooling.cli.main, extproc.runtime.serve' && "
        "echo imports"
    )
    done = podman(
        "run", "--rm", "--runtime", "runc", "--network", "none", "--health-interval", "disable",
        "--entrypoint", "sh", built, "-c", script,
    )  # fmt: skip
    assert done.stdout.strip() == "imports", done.stdout + done.stderr
    size_mb = image.image_size_bytes(built) / 1e6
    print(f"image size: {size_mb:.0f} MB")
    assert size_mb < MAX_SIZE_MB


def test_every_workers_log_and_a_workers_death_are_the_containers_output(
    built: str, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    """`serve --workers 2` in the image, on a real Redis (the budget scripts are in it too):
    both workers' lines reach `podman logs`, and so does one's death, which ends the
    container (exit 1) for its restart policy to start again."""
    redis, redis_port = start_redis(tmp_path)
    processes.append(redis)
    policy = write_policy(tmp_path / "policy.yaml", redis_port)
    policy.chmod(0o644)
    grpc_port = free_port()
    name = f"slogate-test-{os.getpid()}-workers"
    started = podman(
        "run", "-d", "--name", name, "--runtime", "runc", "--network", "host",
        "--health-interval", "disable", "--read-only", "--tmpfs", "/tmp",
        "-e", f"SLOGATE_HEALTH_ADDRESS=127.0.0.1:{grpc_port}",
        "-v", f"{policy}:/etc/slogate/policy.yaml:ro", built,
        "serve", "--policy", "/etc/slogate/policy.yaml", "--host", "127.0.0.1",
        "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()),
        "--admin-address", "none", "--no-exact-tokenizer", "--workers", "2",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        while podman("healthcheck", "run", name).returncode != 0:
            assert time.monotonic() < deadline, podman("logs", name).stdout
            time.sleep(0.5)
        logs = podman("logs", name).stdout
        while "slogate sidecar ready" not in logs:  # healthy once a worker is: wait for both
            assert time.monotonic() < deadline, logs
            time.sleep(0.2)
            logs = podman("logs", name).stdout
        pids = {}
        for index in (0, 1):
            found = re.search(rf"(?m)^\[worker-{index}\] .*worker up: .* pid (\d+)", logs)
            assert found, logs
            pids[index] = int(found.group(1))
        assert podman("exec", name, "sh", "-c", f"kill -9 {pids[1]}").returncode == 0
        assert podman("wait", name, timeout_s=60).stdout.strip() == "1"
        logs = podman("logs", name).stdout
        assert f"worker-1 (pid {pids[1]}) was killed by SIGKILL" in logs, logs
    finally:
        podman("rm", "-f", "--ignore", name)


def test_the_manifests_name_the_image_this_builds() -> None:
    manifests = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
    named = {
        found
        for manifest in manifests.glob("*.yaml")
        for found in re.findall(r"image: (\S*slogate/slogate\S*)", manifest.read_text())
    }
    assert named == {image.public_tag()}
