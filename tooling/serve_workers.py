"""`slogate serve --workers N`: the supervisor of N sidecar worker processes.

What lives here: `run_workers`, which starts the workers on one gRPC port (each a
`slogate serve --worker ...`, extproc.runtime.workers says how they cooperate), serves
their merged /metrics on the public port, passes SIGHUP on, and stops them all on SIGINT /
SIGTERM or when one exits (the pod restarts as a whole).
"""

from __future__ import annotations

import http.server
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from extproc.runtime.workers import merge_expositions
from extproc.service.log_records import json_logs
from tooling.processes import ManagedProcess, python_module

log = logging.getLogger("slogate.workers")


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    worker_urls: list[str] = []

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404)
            return
        texts = []
        for url in self.worker_urls:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    texts.append(response.read().decode())
            except OSError as error:
                log.warning("worker metrics %s: %s", url, error)
        body = merge_expositions(texts).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def run_workers(
    count: int,
    policy_path: Path,
    host: str,
    grpc_port: int,
    metrics_port: int | None,
    metrics_host: str | None,
    admin_address: str | None,
    exact: bool,
    log_options: tuple[str, ...] = (),
) -> int:
    """Start `count` workers on one gRPC port and serve their merged /metrics until SIGINT
    or SIGTERM, or until one exits."""
    if grpc_port == 0:
        print("slogate serve: --workers needs a fixed --grpc-port (they share it)", file=sys.stderr)
        return 2
    socket_dir = Path(tempfile.mkdtemp(prefix="slogate-workers-"))
    base = os.urandom(3).hex()
    workers: list[ManagedProcess] = []
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())

    def reload(*_: object) -> None:  # the workers reread the policy file themselves
        for worker in workers:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGHUP)

    signal.signal(signal.SIGHUP, reload)
    try:
        metrics_urls = []
        for index in range(count):
            argv = python_module(
                "tooling.cli",
                "serve",
                "--policy", str(policy_path),
                "--host", host,
                "--grpc-port", str(grpc_port),
                "--metrics-port", "0",
                "--metrics-host", "127.0.0.1",
                "--admin-address",
                (admin_address or "none") if index == 0 else "none",
                "--worker", f"{index},{count},{base},{socket_dir}",
            )  # fmt: skip
            if not exact:
                argv.append("--no-exact-tokenizer")
            argv.extend(log_options)  # the workers log as the supervisor was told to
            proc = ManagedProcess(f"worker-{index}", argv, socket_dir).start()
            workers.append(proc)
        for proc in workers:
            match = proc.wait_for_line(r"sidecar ready: grpc \S+ metrics http://([^/]+)/metrics")
            metrics_urls.append(f"http://{match.group(1)}/metrics")
        _MetricsHandler.worker_urls = metrics_urls
        server = None
        shown = ""
        if metrics_port is not None:
            server = http.server.ThreadingHTTPServer(
                (metrics_host or host, metrics_port), _MetricsHandler
            )
            threading.Thread(target=server.serve_forever, daemon=True).start()
            shown = f" metrics http://{metrics_host or host}:{server.server_address[1]}/metrics"
        admin = f" admin {admin_address}" if admin_address else ""
        ready = (
            f"slogate sidecar ready: grpc {host}:{grpc_port}{shown}{admin} pid {os.getpid()} "
            f"workers {count} (each: {' '.join(metrics_urls)}; logs: {socket_dir})"
        )
        if json_logs():
            log.info(ready)  # every line of the process is JSON
        else:
            print(ready, flush=True)
        while not stopping.is_set():
            dead = next((w for w in workers if not w.running()), None)
            if dead is not None:
                print(f"{dead.name} exited:\n{dead.log_text()[-3000:]}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        if server is not None:
            server.shutdown()
        return 0
    finally:
        for proc in workers:
            proc.stop()
