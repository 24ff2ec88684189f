"""`slogate serve --workers N`: the supervisor of N sidecar worker processes.

What lives here: `run_workers`, which starts the workers on one gRPC port (each a
`python -m extproc.runtime.serve_command --worker ...`; extproc.runtime.workers says how
they cooperate) as extproc.runtime.processes' ManagedProcess with a line sink, serves their
merged /metrics on the public port, passes SIGHUP on, relays every line a worker
writes to its own standard output (a container's log is the supervisor's output: files in a
temporary folder are what `kubectl logs` never shows), and stops them all on SIGINT /
SIGTERM or when one exits, saying so there (the pod restarts as a whole).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from extproc.runtime.processes import ManagedProcess, python_module
from extproc.runtime.workers import merge_expositions
from extproc.service.log_records import json_logs

log = logging.getLogger("slogate.workers")
_READY = re.compile(r"sidecar ready: grpc \S+ metrics http://([^/]+)/metrics")


class _Relay:
    """The supervisor's standard output, shared by the workers' relays: a worker's text line
    gets `[worker-N] ` in front; with JSON logs, a JSON record gets a "worker" field and any
    other line (a traceback from a crash) becomes a record of its own, so every line stays
    one JSON object."""

    def __init__(self, json_lines: bool) -> None:
        self._json = json_lines
        self._lock = threading.Lock()  # whole lines: two workers never interleave within one

    def line(self, worker: int | None, text: str, level: str = "INFO") -> None:
        if self._json:
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                record = {
                    "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                    "level": level,
                    "logger": "slogate.workers",
                    "message": text,
                }
            if worker is not None:
                record["worker"] = worker
            text = json.dumps(record, separators=(",", ":"))
        elif worker is not None:
            text = f"[worker-{worker}] {text}"
        with self._lock, contextlib.suppress(BrokenPipeError):
            print(text, flush=True)


class _Worker:
    """One `slogate serve --worker` process (extproc.runtime.processes' ManagedProcess); its
    line sink relays its output (stdout and stderr together) line by line and notes the
    metrics address from its ready line."""

    def __init__(self, index: int, argv: list[str], relay: _Relay) -> None:
        self.index = index
        self.name = f"worker-{index}"
        self.metrics_url: str | None = None
        self._ready = threading.Event()
        self._relay = relay
        self._process = ManagedProcess(self.name, argv, None, lines=self._relay_line).start()

    @property
    def pid(self) -> int:
        assert self._process.pid is not None  # started in __init__
        return self._process.pid

    def _relay_line(self, text: str) -> None:
        if self.metrics_url is None and (match := _READY.search(text)):
            self.metrics_url = f"http://{match.group(1)}/metrics"
            self._ready.set()
            # The supervisor's line is the one `sidecar ready` line: `slogate up`, the
            # benchmarks and the tests wait for it and read the merged /metrics from it.
            text = text.replace("sidecar ready:", "worker up:", 1)
        self._relay.line(self.index, text)

    def exit_code(self) -> int | None:
        return self._process.exit_code()

    def reload(self) -> None:
        self._process.signal(signal.SIGHUP)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once ready; False when it exited first or took longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self.exit_code() is not None or time.monotonic() > deadline:
                return False
        return True

    def exited(self) -> str:
        """Its death, said after its last lines (the relay drains the pipe first)."""
        self._process.wait_output()
        code = self.exit_code()
        if code is not None and code < 0:
            return f"{self.name} (pid {self.pid}) was killed by {signal.Signals(-code).name}"
        return f"{self.name} (pid {self.pid}) exited with status {code}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._process.stop(timeout_s)


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
    listener_options: tuple[str, ...] = (),
) -> int:
    """Start `count` workers on one gRPC port and serve their merged /metrics until SIGINT
    or SIGTERM, or until one exits."""
    if grpc_port == 0:
        print("slogate serve: --workers needs a fixed --grpc-port (they share it)", file=sys.stderr)
        return 2
    socket_dir = Path(tempfile.mkdtemp(prefix="slogate-workers-"))  # their private sockets
    base = os.urandom(3).hex()
    relay = _Relay(json_logs())
    workers: list[_Worker] = []
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())

    def reload(*_: object) -> None:  # the workers reread the policy file themselves
        for worker in workers:
            worker.reload()

    def stopped_by(dead: _Worker) -> int:
        message = f"slogate serve: {dead.exited()}; stopping the other workers"
        relay.line(None, message, level="ERROR")
        return 1

    signal.signal(signal.SIGHUP, reload)
    try:
        for index in range(count):
            # serve's own entry point (extproc.runtime.serve_command): a worker loads the
            # sidecar alone, not the tools' command line.
            argv = python_module(
                "extproc.runtime.serve_command",
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
            argv.extend(listener_options)  # TLS, the health port: each worker's own listener
            workers.append(_Worker(index, argv, relay))
        for worker in workers:
            if not worker.wait_ready(timeout_s=60):
                if worker.exit_code() is not None:
                    return stopped_by(worker)
                relay.line(None, f"slogate serve: {worker.name} not ready after 60 s", "ERROR")
                return 1
        metrics_urls = [w.metrics_url for w in workers if w.metrics_url]
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
            f"workers {count} (each: {' '.join(metrics_urls)})"
        )
        relay.line(None, ready)
        while not stopping.is_set():
            dead = next((w for w in workers if w.exit_code() is not None), None)
            if dead is not None:
                return stopped_by(dead)
            time.sleep(0.2)
        if server is not None:
            server.shutdown()
        return 0
    finally:
        for worker in workers:
            worker.stop()
