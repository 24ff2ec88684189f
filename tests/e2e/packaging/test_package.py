"""slogate as a user installs it: the sdist and the wheel built from it, the wheel installed
(not editable) into a fresh virtual environment, and the commands run from a folder that is
not the checkout. What this catches: a data file the product reads that the wheel lacks, a
default path that only exists in the source tree (`slogate up` once stopped with
FileNotFoundError on deploy/policy.example.yaml), tests or caches shipped to users.

How the environment stays honest and fast: the venv is new and slogate's wheel is installed
into it with --no-deps; its dependencies (grpcio, numpy, Envoy's wheel...) come from the
project's environment through a .pth line, added after the install so pip never sees the
editable slogate there. A .pth line adds a folder but runs none of that folder's .pth files,
so the editable install's finder stays off: the test asserts every slogate module is loaded
from the new venv. Envoy's console script, which pip would write with the dependencies, is
written by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from extproc.runtime.processes import ManagedProcess
from extproc.service.admin_auth import TOKEN_FILE_ENV
from extproc.version import VERSION
from tests.support.packaging import PACKAGES, ROOT

# extproc/shipped/ holds links into deploy/ (one copy); the artifacts must carry content.
SHIPPED = {
    "extproc/shipped/policy.example.yaml": "deploy/policy.example.yaml",
    "extproc/shipped/policy.tenants.example.yaml": "deploy/policy.tenants.example.yaml",
    "extproc/shipped/slogate-rules.yaml": "deploy/prometheus/slogate-rules.yaml",
}


def data_files() -> list[str]:
    """Every file in the packages' folders that is not Python source or a cache: what the
    product reads at run time (Lua, workloads, shipped YAML, type stubs). A new one left
    out of pyproject's package-data fails the wheel test."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            if path.is_file():
                found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


@dataclass(frozen=True)
class Install:
    sdist: Path
    wheel: Path
    venv: Path
    site: Path  # the new venv's site-packages
    elsewhere: Path  # the working directory of every command: not the checkout
    env: dict[str, str]

    def slogate(self, *args: str) -> list[str]:
        # env --chdir: the command runs in `elsewhere`, and the pid ManagedProcess signals
        # is slogate's own (env execs it).
        return ["env", "--chdir", str(self.elsewhere), str(self.venv / "bin" / "slogate"), *args]


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Install:
    tmp = tmp_path_factory.mktemp("package")
    dist = tmp / "dist"
    # sdist first, then the wheel from the unpacked sdist (build's default): the wheel test
    # also proves the sdist is enough to build from. --no-isolation: the project's
    # setuptools, no download (build still checks pyproject's build requirements).
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)])
    (sdist,) = dist.glob("slogate-*.tar.gz")
    (wheel,) = dist.glob("slogate-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # --python: the project's pip installs into the new venv, which has none of its own.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    site = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    )
    (site / "slogate_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    envoy = venv / "bin" / "envoy"
    envoy.write_text(f"#!{python}\nimport sys\nfrom envoy._main import main\nsys.exit(main())\n")
    envoy.chmod(0o755)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k != TOKEN_FILE_ENV},
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "PYTHONPATH": "",
        "TMPDIR": str(tmp),  # `slogate up` keeps its logs in a temp folder: this one
        "XDG_STATE_HOME": str(tmp / "state"),  # ... and its admin token here, not in ~
    }
    return Install(sdist, wheel, venv, site, elsewhere, env)


def test_the_wheel_carries_every_data_file_and_no_tests(installed: Install) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        missing = [name for name in data_files() if name not in names]
        assert not missing, f"data files left out of the wheel (pyproject package-data): {missing}"
        for shipped, source in SHIPPED.items():
            assert wheel.read(shipped) == (ROOT / source).read_bytes(), shipped
        top_level = wheel.read(f"slogate-{VERSION}.dist-info/top_level.txt").decode().split()
    assert sorted(top_level) == PACKAGES
    assert not [n for n in names if n.startswith(("tests/", "bench/", "deploy/"))]
    # The build (image, vLLM's install, protos) runs from a checkout only.
    assert not [n for n in names if n.startswith("tooling/build/")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_sdist_carries_the_sources_and_deploy_and_no_tests_or_caches(
    installed: Install,
) -> None:
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
    names = set(members)
    assert not [name for name in data_files() if name not in names]
    for shipped, source in SHIPPED.items():  # content, so a wheel can be built from it
        assert members[shipped].isfile(), f"{shipped} is a link in the sdist"
        assert source in names
    assert {"pyproject.toml", "README.md", "MANIFEST.in", "tooling/cli/main.py"} <= names
    assert "deploy/grafana/slogate-dashboard.json" in names
    assert "protos/extproc/adminpb/admin.proto" in names
    assert "protos/upstream/envoy/service/ext_proc/v3/external_processor.proto" in names
    unwanted = ("tests/", "bench/", ".cache/", ".mypy_cache/", ".venv", "deploy/k8s/schemas/")
    assert not [n for n in names if n.startswith(unwanted)]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_every_slogate_module_and_file_comes_from_the_new_venv(installed: Install) -> None:
    probe = (
        "import importlib, json; from extproc.shipped import example_policy, alert_rules;"
        f"mods = {{n: importlib.import_module(n).__file__ for n in {PACKAGES!r}}};"
        "print(json.dumps({'mods': mods, 'files': [str(example_policy()), str(alert_rules())]}))"
    )
    found = json.loads(
        run(
            [str(installed.venv / "bin" / "python"), "-c", probe],
            cwd=installed.elsewhere,
            env=installed.env,
        )
    )
    for path in [*found["mods"].values(), *found["files"]]:
        assert Path(path).is_relative_to(installed.site), path
        assert not Path(path).is_symlink(), path


def test_version_and_simulate_run_outside_the_checkout(installed: Install) -> None:
    out = run(installed.slogate("--version"), env=installed.env)
    assert out.strip() == f"slogate {VERSION}"
    # A packaged workload (sim/workloads/smoke.yaml), its first 5 s.
    run(
        installed.slogate(
            "simulate", "--workload", "smoke", "--duration-s", "5", "--out-dir", "out"
        ),
        env=installed.env,
    )
    report = json.loads((installed.elsewhere / "out" / "simulate-smoke.json").read_text())
    assert report


def started(install: Install, name: str, *args: str) -> ManagedProcess:
    log_dir = install.venv.parent / "logs"
    return ManagedProcess(name, install.slogate(*args), log_dir, install.env).start()


def said_the_packaged_policy(proc: ManagedProcess, install: Install) -> None:
    policy = install.site / "extproc" / "shipped" / "policy.example.yaml"
    assert f"using the example policy shipped with slogate, {policy}" in proc.log_text()


def test_serve_runs_on_the_packaged_example_policy(installed: Install) -> None:
    from grpc import aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    proc = started(
        installed,
        "serve",
        "serve",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--admin-address",
        "127.0.0.1:0",
    )
    try:
        port = int(proc.wait_for_line(r"sidecar ready: grpc [^:]+:(\d+)", 120).group(1))
        said_the_packaged_policy(proc, installed)

        async def check() -> int:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="")
                )
                return int(reply.status)

        assert asyncio.run(check()) == health_pb2.HealthCheckResponse.SERVING
    finally:
        code = proc.stop(30)
    assert code == 0, proc.log_text()[-3000:]


def test_up_serves_a_chat_through_envoy(installed: Install) -> None:
    ports = ["--listen-port", "0", "--admin-port", "0", "--grpc-port", "0"]
    ports += ["--metrics-port", "0", "--admin-api-port", "0"]
    ports += [f"--pool-port={pool}=0" for pool in ("default", "long", "fallback")]
    proc = started(installed, "up", "up", *ports, "--time-scale", "0.05")
    try:
        url = proc.wait_for_line(r"slogate up: (http://\S+)", 120).group(1)
        said_the_packaged_policy(proc, installed)
        # Its admin token: made 0600 where the CLI looks, which sends it by itself.
        admin, token = proc.wait_for_line(r"slogate admin (\S+) \(token (\S+)\)").groups()
        assert token == installed.env["XDG_STATE_HOME"] + "/slogate/admin-token"
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        drill = ["drill", "--pool", "default", "--level", "0", "--minutes", "0"]
        run(installed.slogate(*drill, "--admin", admin), env=installed.env)
        body = {
            "model": "deepseek-v4",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        }
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": "Bearer sk-demo-standard",
                "content-type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert reply.status == 200
            assert json.loads(reply.read())["choices"]
    finally:
        code = proc.stop(60)
    assert code == 0, proc.log_text()[-3000:]
    assert "slogate up: stopped" in proc.log_text()
