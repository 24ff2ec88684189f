"""`slogate bench reloads`: does anything grow when the policy is reloaded, again and again,
under traffic?

A real `slogate serve` with the thousand-tenant, ten-thousand-key policy
(tooling.benchmarks.tenants), requests admitted and settled without pause by a few
concurrent clients speaking as Envoy does (tooling.benchmarks.driver: headers, body, then
the access-log entry), while the policy file is edited and SIGHUP sent, one reload after
the other as soon as the last is logged, `--reloads` times (1,000 by default). Each edit
adds a key never seen before and drops the one the edit before added, so the policy keeps
its size while every reload brings content the sidecar has not seen (a cache or table
keyed by a key that a removal does not clear grows here).

Every few reloads, from the sidecar's own /metrics: resident memory
(process_resident_memory_bytes) and what the collector's permanent generation holds
(slogate_gc_frozen_objects: `gc.freeze()` at start and after each reload's install,
extproc.runtime.heap). The slope of each over the reloads after the first fifth (the
allocator's arenas fill first) is the growth per reload, least squares. Writes
bench/results/reloads.{md,json}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from extproc.runtime.processes import ManagedProcess, python_module
from policy.quantiles import quantile
from tooling.benchmarks.driver import SidecarDriver
from tooling.benchmarks.engine_counters import engine_counters
from tooling.benchmarks.levers import BENCH_KEY
from tooling.benchmarks.reports import write_report
from tooling.benchmarks.tenants import many_tenants_policy, reload_times
from tooling.stack.processes import free_port

HOST = "127.0.0.1"
SAMPLE_EVERY = 10  # reloads between two readings of /metrics
READINGS = ("process_resident_memory_bytes", "slogate_gc_frozen_objects")
CLIENTS = 4
_BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "How far is the moon? " * 40}],
    "max_tokens": 64,
}


def rotating_edits(source: Path) -> tuple[str, str]:
    """The policy's text with its keys last, and the tenant the added keys name: an edit is
    that text plus one key entry appended (the list goes on at the end of the file)."""
    raw = yaml.safe_load(source.read_text())
    keys = raw.pop("keys")
    raw["keys"] = keys
    text = yaml.safe_dump(raw, sort_keys=False)
    if not text.rstrip().endswith(f"tenant: {keys[-1]['tenant']}"):
        raise AssertionError("the policy's key list is not where an edit appends")
    return text, keys[0]["tenant"]


def edit(base: str, tenant: str, number: int) -> str:
    digest = hashlib.sha256(f"sk-rotated-{number}".encode()).hexdigest()
    return f"{base}- key_sha256: {digest}\n  tenant: {tenant}\n"


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


class _Traffic:
    """Clients admitting and settling requests until stopped, in a thread of their own."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.latencies_ms: list[float] = []
        self.statuses: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> _Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        driver = SidecarDriver(self.target)
        try:
            await asyncio.gather(*(self._client(driver) for _ in range(CLIENTS)))
        finally:
            await driver.close()

    async def _client(self, driver: SidecarDriver) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            reply = await driver.decide(BENCH_KEY, _BODY)
            self.latencies_ms.append((time.perf_counter() - t0) * 1000)
            self.statuses[reply.status] = self.statuses.get(reply.status, 0) + 1
            if reply.tracking_id is not None:
                await driver.report([reply.outcome(200, 900, 64)])


def run(out_dir: Path, reloads: int = 1000, tenants: int = 1000, keys: int = 10_000) -> dict:
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-reloads-"))
    base, tenant = rotating_edits(many_tenants_policy(work, tenants, keys))
    policy = work / "serving.yaml"
    policy.write_text(edit(base, tenant, 0))
    grpc_port, metrics_port = free_port(), free_port()
    argv = [
        *python_module("tooling.cli.main", "serve", "--policy", str(policy)),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--admin-address", "none",
    ]  # fmt: skip
    side = ManagedProcess("serve-reloads", argv, work).start()
    metrics_url = f"http://{HOST}:{metrics_port}"
    samples: list[dict[str, float]] = []
    try:
        side.wait_for_line(r"sidecar ready", timeout_s=180)
        assert side.pid is not None
        traffic = _Traffic(f"{HOST}:{grpc_port}").start()
        started = time.monotonic()
        try:
            samples.append(
                {"reload": 0, "s": 0.0, **engine_counters(metrics_url, READINGS, timeout_s=10)}
            )
            for number in range(1, reloads + 1):
                staged = policy.with_suffix(".next")
                staged.write_text(edit(base, tenant, number))
                staged.replace(policy)  # as an editor saves: the sidecar never reads half
                os.kill(side.pid, signal.SIGHUP)
                deadline = time.monotonic() + 120
                while len(reload_times(side.log_text())) < number:
                    if time.monotonic() > deadline or not side.running():
                        raise RuntimeError(f"reload {number} never logged:\n{side.log_text()}")
                    time.sleep(0.02)
                if number % SAMPLE_EVERY == 0 or number == reloads:
                    at = time.monotonic() - started
                    samples.append(
                        {
                            "reload": number,
                            "s": at,
                            **engine_counters(metrics_url, READINGS, timeout_s=10),
                        }
                    )
                    print(json.dumps(samples[-1]), flush=True)
        finally:
            traffic.stop()
        reload_ms = reload_times(side.log_text())
    finally:
        side.stop()
    report = _report(samples, reload_ms, traffic, tenants, keys)
    write_report(out_dir, "reloads", report, _markdown(report), indent=1)
    print(_markdown(report))
    return report


def _report(
    samples: list[dict[str, float]],
    reload_ms: list[float],
    traffic: _Traffic,
    tenants: int,
    keys: int,
) -> dict[str, Any]:
    settled = [s for s in samples if s["reload"] >= samples[-1]["reload"] / 5]
    rss = [(s["reload"], s["process_resident_memory_bytes"] / 2**20) for s in settled]
    frozen = [(s["reload"], s["slogate_gc_frozen_objects"]) for s in settled]
    lat = traffic.latencies_ms
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "tenants": tenants,
        "keys": keys,
        "reloads": len(reload_ms),
        "seconds": samples[-1]["s"],
        "reload_ms_p50": statistics.median(reload_ms),
        "reload_ms_p99": quantile(reload_ms, 0.99),
        "requests": len(lat),
        "statuses": {str(k): v for k, v in sorted(traffic.statuses.items())},
        "request_ms_p50": quantile(lat, 0.5),
        "request_ms_p99": quantile(lat, 0.99),
        "rss_mib_start": samples[0]["process_resident_memory_bytes"] / 2**20,
        "rss_mib_settled": rss[0][1],
        "rss_mib_end": rss[-1][1],
        "rss_kib_per_reload": slope(rss) * 1024,
        "frozen_start": samples[0]["slogate_gc_frozen_objects"],
        "frozen_end": samples[-1]["slogate_gc_frozen_objects"],
        "frozen_per_reload": slope(frozen),
        "samples": samples,
    }


def _markdown(r: dict[str, Any]) -> str:
    per_1000 = r["rss_kib_per_reload"] * 1000 / 1024
    return (
        f"# {r['reloads']} reloads under traffic ({r['when']})\n\n"
        f"{r['cpus']} CPUs. `slogate serve` with {r['tenants']} tenants / {r['keys']} keys; "
        f"{CLIENTS} clients admitting and settling requests throughout ({r['requests']} "
        f"requests, statuses {r['statuses']}, client-timed p50 {r['request_ms_p50']:.2f} ms, "
        f"p99 {r['request_ms_p99']:.2f} ms); each reload a key added and the last one's "
        f"removed, SIGHUP, the next once the last is logged ({r['seconds']:.0f} s in all; "
        f"reload p50 {r['reload_ms_p50']:.0f} ms, p99 {r['reload_ms_p99']:.0f} ms). Readings "
        f"every {SAMPLE_EVERY} reloads from the sidecar's /metrics; slopes: least squares over "
        "the reloads after the first fifth.\n\n"
        "| | at start | after the first fifth | at the end | slope per reload "
        "| per 1,000 reloads |\n"
        "|---|---|---|---|---|---|\n"
        f"| resident memory (MiB) | {r['rss_mib_start']:.1f} | {r['rss_mib_settled']:.1f} | "
        f"{r['rss_mib_end']:.1f} | {r['rss_kib_per_reload']:.2f} KiB | {per_1000:.1f} MiB |\n"
        f"| frozen objects (gc.freeze) | {r['frozen_start']:.0f} | | {r['frozen_end']:.0f} | "
        f"{r['frozen_per_reload']:.1f} | {r['frozen_per_reload'] * 1000:.0f} |\n"
    )
