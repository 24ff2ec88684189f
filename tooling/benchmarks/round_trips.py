"""Every Redis round trip a request makes, counted on a real sidecar (`slogate bench decisions`).

What lives here: `census`, which starts a fixed-answer upstream, a real valkey/redis server, one
`slogate serve` on the Redis store (its tenant with spend budgets) and a real Envoy in front,
sends requests one at a time,
and reads Redis's MONITOR meanwhile: each command a client sent (not the ones a script ran
inside the server), the scripts named by their SHA. The commands are split into those each
request makes (reserve and KV hold at the body decision; settle and KV release at the access
log) and the periodic ones the sidecar's loops make whatever the traffic (heartbeats, the KV
ledger's expiry and refresh, the tenants' service shares, the key store's polls).
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from admission.kv.redis_ledger import RedisBook
from budget.redis_scripts import family
from budget.redis_store import RedisStore
from budget.spend_redis import RedisSpendStore
from extproc.runtime.processes import ManagedProcess, python_module
from tooling.benchmarks.levers import BENCH_KEY
from tooling.benchmarks.overhead import _request_body, front_envoy
from tooling.benchmarks.workers import redis_policy
from tooling.benchmarks.wrk import HOST, start_envoy, upstream_bootstrap
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis

# Where in a request each script runs (the others are periodic).
PER_REQUEST = {
    "reserve.lua": "body decision: budget reserve",
    "spend_reserve.lua": "body decision: spend reserve",
    "kv_hold.lua": "body decision: KV hold",
    "settle.lua": "access log: budget settle",
    "spend_settle.lua": "access log: spend settle",
    "kv_release.lua": "access log: KV release",
}


def script_names() -> dict[str, str]:
    """SHA1 of each script the stores send -> its file name."""
    names = {}
    for store in (RedisStore, RedisSpendStore, RedisBook):
        for name, source in family(store.COMMON, store.SCRIPTS, store.PACKAGE).items():
            names[hashlib.sha1(source.encode()).hexdigest()] = name
    return names


_LINE = re.compile(r"^\+[\d.]+ \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


class Monitor:
    """Redis's MONITOR on a socket of its own, read in a thread: what each client sent."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection((HOST, port))
        self._sock.sendall(b"MONITOR\r\n")
        self._sock.settimeout(5.0)
        self._raw = bytearray(self._sock.recv(5))  # +OK: the server monitors from here on
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not chunk:
                return
            self._raw += chunk

    def stop(self) -> list[list[str]]:
        """The commands clients sent (the scripts' own commands left out), each as its words."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        return client_commands(self._raw.decode(errors="replace"))


def client_commands(monitored: str) -> list[list[str]]:
    """MONITOR's lines as the commands clients sent, each as its words; the commands a
    script ran inside the server (`[0 lua]`) are not round trips and are left out."""
    commands = []
    for line in monitored.splitlines():
        match = _LINE.match(line)
        if match is None or match.group(1) == "lua":
            continue
        commands.append(_ARG.findall(match.group(2)))
    return commands


def command_name(words: list[str], scripts: dict[str, str]) -> str:
    """`EVALSHA reserve.lua` for a script `scripts` knows by its SHA, else the command."""
    command = words[0].upper()
    if command == "EVALSHA" and len(words) > 1:
        return f"EVALSHA {scripts.get(words[1], words[1][:8])}"
    return command


def _with_spend(policy: Path) -> Path:
    """The bench's tenant with day and month spend budgets it never uses up: a tenant with
    spend budgets is the case with the most round trips."""
    raw = yaml.safe_load(policy.read_text())
    huge = 10**15
    raw["tenants"] = {
        "defaults": {"tier": "standard"},
        "list": {"bench": {"spend": {"per_day": huge, "per_month": huge}}},
    }
    spent = policy.with_name("policy-spend.yaml")
    spent.write_text(yaml.safe_dump(raw))
    return spent


def census(work: Path, requests: int = 100) -> dict[str, Any]:
    """Send `requests` chat completions one at a time through Envoy and a sidecar on Redis;
    each command clients sent to Redis meanwhile, per request."""
    procs: list[ManagedProcess] = []
    try:
        upstream_port, upstream_admin = free_port(), free_port()
        procs.append(
            start_envoy(
                "census-upstream",
                upstream_bootstrap(upstream_port, upstream_admin),
                upstream_admin,
                work,
            )
        )
        redis, redis_port = start_redis(work, "census-redis")
        procs.append(redis)
        grpc_port = free_port()
        argv = [
            *python_module("tooling.cli.main", "serve"),
            "--policy", str(_with_spend(redis_policy(work, redis_port))),
            "--grpc-port", str(grpc_port), "--metrics-port", "0", "--admin-address", "none",
        ]  # fmt: skip
        sidecar = ManagedProcess("census-serve", argv, work).start()
        procs.append(sidecar)
        sidecar.wait_for_line(r"sidecar ready", timeout_s=90)
        url, envoy = front_envoy("census-envoy", upstream_port, grpc_port, work)
        procs.append(envoy)
        body = _request_body().encode()

        def send() -> None:
            headers = {"content-type": "application/json", "authorization": f"Bearer {BENCH_KEY}"}
            request = urllib.request.Request(url, data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()

        for _ in range(10):  # warm-up: connections, scripts loaded
            send()
        time.sleep(1.0)  # the warm-up's access-log entries are in
        monitor = Monitor(redis_port)
        started = time.monotonic()
        for _ in range(requests):
            send()
        time.sleep(1.0)  # the last access-log entries are in (Envoy batches them)
        seconds = time.monotonic() - started
        commands = monitor.stop()
    finally:
        for proc in reversed(procs):
            proc.stop()
    counts = Counter(command_name(words, script_names()) for words in commands if words)
    return {"requests": requests, "seconds": seconds, **split(counts, requests, seconds)}


def split(counts: Mapping[str, int], requests: int, seconds: float) -> dict[str, Any]:
    """The commands each request makes (per request, named by where in it they run) apart
    from the rest (per second)."""
    per_request, periodic = {}, {}
    for name, n in counts.items():
        where = PER_REQUEST.get(name.removeprefix("EVALSHA "))
        if name.startswith("EVALSHA ") and where is not None:
            per_request[f"{where} ({name})"] = n / requests
        elif name != "MONITOR":
            periodic[name] = n / seconds
    return {
        "per_request": dict(sorted(per_request.items())),
        "periodic_per_s": dict(sorted(periodic.items())),
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| where | Redis command (one round trip each) | per request |",
        "| --- | --- | ---: |",
    ]
    for name, per in report["per_request"].items():
        where, command = name.split(" (", 1)
        lines.append(f"| {where} | {command.rstrip(')')} | {per:.2f} |")
    total = sum(report["per_request"].values())
    lines.append(f"| **all, per request** | | **{total:.2f}** |")
    lines.append("")
    lines.append(
        "| not per request: the sidecar's loops, and the pool opening a connection (HELLO, "
        "CLIENT SETINFO) | in the run | per second |"
    )
    lines.append("| --- | ---: | ---: |")
    for name, rate in report["periodic_per_s"].items():
        lines.append(f"| {name} | {rate * report['seconds']:.0f} | {rate:.1f} |")
    return "\n".join(lines)
