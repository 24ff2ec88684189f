"""`slogate bench tenants`: a thousand-tenant, ten-thousand-key policy against the demo policy.

In one run, both policies: how long loading takes and what a started sidecar weighs (RSS);
the body decision at the field mix (in process, as `bench decision-cost`, each policy's own
sidecar); and, through gRPC against a real `slogate serve`, timed by the client: requests
the sidecar answers itself (a 400 from the body phase) sent one at a time, first alone and
then while the policy is reloaded over and over (SIGHUP). The client's clock is the one
that counts: a blocked event loop delays a message before any timer inside the sidecar
starts. Writes bench/results/tenants.{md,json}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.native import exact_counter
from extproc.runtime.processes import ManagedProcess, python_module
from extproc.runtime.sidecar import Sidecar
from policy.loader import load_policy
from policy.quantiles import quantile
from tooling.benchmarks.decision_cost import _measure
from tooling.benchmarks.driver import SidecarDriver
from tooling.benchmarks.levers import BENCH_KEY, bench_policy
from tooling.benchmarks.reports import write_report
from tooling.stack.processes import free_port, proc_stat

HOST = "127.0.0.1"


def generated_key(index: int) -> str:
    """The clear text of generated key `index` (the policy holds only its SHA-256)."""
    return f"sk-gen-{index:05d}"


CLASSES: dict[str, Any] = {
    "self-serve": {"tier": "standard", "limits": {"tokens_per_minute": 200_000}},
    "team": {"tier": "standard", "limits": {"tokens_per_minute": 1_000_000}, "weight": 2},
    "enterprise": {
        "tier": "critical",
        "limits": {"tokens_per_minute": 4_000_000, "concurrent_requests": 64},
        "slo": {"ttft_p99_ms": 1500, "tpot_p99_ms": 60},
        "weight": 4,
    },
    "batch": {"tier": "sheddable", "weight": 0.5},
}


def many_tenants_policy(work: Path, tenants: int = 1000, keys: int = 10_000) -> Path:
    """The bench policy plus `tenants` tenants, every one listed (the worst case for
    reading it) under four classes, every tenth with limits of its own, and `keys` hashed
    keys that name only their tenant."""
    raw = yaml.safe_load(bench_policy(work).read_text())
    names = list(CLASSES)
    listed: dict[str, Any] = {}
    for number in range(tenants):
        entry: dict[str, Any] = {"class": names[number % len(names)]}
        if number % 10 == 0:
            entry["limits"] = {"tokens_per_minute": 100_000 + number}
        listed[f"tenant-{number:04d}"] = entry
    raw["tenants"] = {"defaults": {"class": "self-serve"}, "classes": CLASSES, "list": listed}
    for index in range(keys):
        digest = hashlib.sha256(generated_key(index).encode()).hexdigest()
        tenant = f"tenant-{index * tenants // keys:04d}"
        raw["keys"].append({"key_sha256": digest, "tenant": tenant})
    path = work / f"policy-{tenants}-tenants.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _stats_ms(samples: list[float]) -> dict[str, float]:
    return {
        "requests": len(samples),
        "p50_ms": quantile(samples, 0.5),
        "p99_ms": quantile(samples, 0.99),
        "max_ms": max(samples),
        "over_20ms": sum(1 for s in samples if s > 20.0),
    }


def _rss_mib(pid: int) -> float:
    stat = proc_stat(pid)
    return 0.0 if stat is None else stat[2]


async def _bad_bodies(target: str, key: str, seconds: float, reload_pid: int | None) -> Any:
    """One request at a time for `seconds`; with `reload_pid`, a SIGHUP every
    seconds / 6 (five reloads). Returns the client-timed milliseconds."""
    driver = SidecarDriver(target)
    times: list[float] = []
    statuses: dict[int, int] = {}
    reloads = 0
    started = time.perf_counter()
    next_reload = started + seconds / 6
    try:
        while time.perf_counter() - started < seconds:
            if reload_pid is not None and time.perf_counter() >= next_reload and reloads < 5:
                os.kill(reload_pid, signal.SIGHUP)
                reloads += 1
                next_reload += seconds / 6
            t0 = time.perf_counter()
            reply = await driver.decide(key, {}, raw=b'{"model": "m", "messages": [')
            times.append((time.perf_counter() - t0) * 1000)
            statuses[reply.status] = statuses.get(reply.status, 0) + 1
    finally:
        await driver.close()
    return times, statuses, reloads


def _serve_phase(name: str, policy: Path, key: str, seconds: float, work: Path) -> dict[str, Any]:
    port = free_port()
    argv = [
        *python_module("tooling.cli.main", "serve", "--policy", str(policy)),
        "--grpc-port", str(port), "--metrics-port", "0", "--admin-address", "none",
    ]  # fmt: skip
    t0 = time.perf_counter()
    side = ManagedProcess(f"serve-{name}", argv, work).start()
    try:
        side.wait_for_line(r"sidecar ready", timeout_s=120)
        start_s = time.perf_counter() - t0
        assert side.pid is not None
        rss_ready = _rss_mib(side.pid)
        target = f"{HOST}:{port}"
        quiet, statuses, _ = asyncio.run(_bad_bodies(target, key, seconds, None))
        busy, _, reloads = asyncio.run(_bad_bodies(target, key, seconds, side.pid))
        deadline = time.monotonic() + 60
        while len(_reload_times(side.log_text())) < reloads and time.monotonic() < deadline:
            time.sleep(0.2)
        reload_ms = _reload_times(side.log_text())
        return {
            "policy": name,
            "start_s": start_s,
            "rss_ready_mib": rss_ready,
            "rss_end_mib": _rss_mib(side.pid),
            "statuses": statuses,
            "alone": _stats_ms(quiet),
            "reloading": _stats_ms(busy),
            "reloads_sent": reloads,
            "reload_ms": reload_ms,
        }
    finally:
        side.stop()


def _reload_times(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"policy reloaded .* in ([0-9.]+) ms", log)]


def _load_s(path: Path) -> float:
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        load_policy(path)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


async def _decisions(policies: dict[str, Path], seconds: float) -> dict[str, dict[str, Any]]:
    bpe = DeepSeekBpe()
    counter = None
    rows: dict[str, dict[str, Any]] = {}
    sidecars = {}
    for name, path in policies.items():
        sidecar = Sidecar(path, metrics_port=None, admin_address=None)
        counter = counter or exact_counter(sidecar.policy().counting.engine)
        sidecar.path.counter.use(counter)
        sidecars[name] = sidecar
    for _ in range(2):  # interleaved request by request (the machine is shared), twice
        for row in await _measure(sidecars, "field_mix", bpe, seconds / 2):
            rows.setdefault(row["setup"], {"p50": [], "p99": []})
            rows[row["setup"]]["p50"].append(row["decision_p50_ms"])
            rows[row["setup"]]["p99"].append(row["decision_p99_ms"])
    for sidecar in sidecars.values():
        await sidecar.stop()
    return {
        name: {"decision_p50_ms": statistics.median(r["p50"]), "decision_p99_ms": max(r["p99"])}
        for name, r in rows.items()
    }


def _table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = [
        "| policy | keys | load s | start s | RSS MiB (ready / end) | decision p50 / p99 ms "
        "| 400 alone p50 / p99 / max ms (>20 ms) | 400 while reloading p50 / p99 / max ms "
        "(>20 ms) | reloads, ms each |",
        "| --- | ---: | ---: | ---: | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        a, b = r["alone"], r["reloading"]
        reloads = ", ".join(f"{ms:.0f}" for ms in r["reload_ms"])
        lines.append(
            f"| {r['policy']} | {r['keys']} | {r['load_s']:.3f} | {r['start_s']:.2f} "
            f"| {r['rss_ready_mib']:.0f} / {r['rss_end_mib']:.0f} "
            f"| {r['decision_p50_ms']:.2f} / {r['decision_p99_ms']:.2f} "
            f"| {a['p50_ms']:.2f} / {a['p99_ms']:.2f} / {a['max_ms']:.1f} ({a['over_20ms']}) "
            f"| {b['p50_ms']:.2f} / {b['p99_ms']:.2f} / {b['max_ms']:.1f} ({b['over_20ms']}) "
            f"| {r['reloads_sent']}: {reloads} |"
        )
    return "\n".join(lines)


def run(
    out_dir: Path, seconds: float = 20.0, tenants: int = 1000, keys: int = 10_000
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-tenants-"))
    policies = {
        "demo": bench_policy(work),
        f"{tenants}-tenants": many_tenants_policy(work, tenants, keys),
    }
    decisions = asyncio.run(_decisions(policies, seconds / 2))
    rows = []
    for name, path in policies.items():
        row = {
            "keys": len(load_policy(path).keys),
            "load_s": _load_s(path),
            **decisions[name],
            **_serve_phase(name, path, BENCH_KEY, seconds, work),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report = {"when": when, "cpus": os.cpu_count(), "seconds": seconds, "rows": rows}
    table = _table(report)
    write_report(
        out_dir,
        "tenants",
        report,
        f"# A thousand tenants against the demo policy ({when})\n\n{os.cpu_count()} CPUs. "
        "load: `load_policy`, median of 3. start: `slogate serve` spawned to its ready line. "
        "decision: the body decision at the field mix, in process (as bench decision-cost), "
        "median p50 and worst p99 of two interleaved rounds. 400: a body the sidecar refuses "
        f"itself, one at a time for {seconds:.0f} s over gRPC, timed by the client; then the "
        "same while five SIGHUP reloads run (each reload's time from the sidecar's log).\n\n"
        f"{table}\n",
        indent=2,
    )
    print(table)
    return report
