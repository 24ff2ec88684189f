"""`slogate bench tenants`: a thousand-tenant, ten-thousand-key policy against the demo policy.

In one run, both policies: how long loading takes and what a started sidecar weighs (RSS);
the body decision at the field mix (in process, as `bench decision-cost`, each policy's own
sidecar); and, through gRPC against a real `slogate serve`, timed by the client: requests
the sidecar answers itself (a 400 from the body phase) sent one at a time, alone
and while the policy is reloaded as an operator would: the file edited (a key added, a
tenant's limit changed; the texts made before the clock starts) and SIGHUP sent, five
times, each reload's window after a quiet one as long (interleaved: the same run's
baseline, the machine's other work falling on both alike). The client's clock is the one
that counts: a blocked event loop delays a message before any timer inside the sidecar
starts. And in process, without the noise of the rest of the machine's work between
client and sidecar: how late the event loop wakes while each way of reloading builds the
same five edits (`_loop_gaps`): in a thread beside the loop (as reloads were built before
extproc.runtime.policy_build), in the builder process sending all of the policy, and in
the builder sending only what changed (what a reload does). Writes
bench/results/tenants.{md,json}.
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
from extproc.runtime.heap import off_loop
from extproc.runtime.policy_build import Built, build_elsewhere, text_digest
from extproc.runtime.processes import ManagedProcess, python_module
from extproc.runtime.sidecar import Sidecar
from policy.loader import load_policy, policy_from_text
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


RELOADS = 5


def operator_edits(policy: Path, count: int = RELOADS) -> list[str]:
    """`count` successive versions of the policy's text, each the one before with a key
    added and (where it lists tenants) one listed tenant's tokens per minute changed."""
    raw = yaml.safe_load(policy.read_text())
    listed = sorted(((raw.get("tenants") or {}).get("list") or {}).items())
    texts = []
    for edit in range(count):
        digest = hashlib.sha256(f"sk-reload-{edit}".encode()).hexdigest()
        raw["keys"].append({"key_sha256": digest, "tenant": raw["keys"][0]["tenant"]})
        if listed:
            _, entry = listed[(edit * 97) % len(listed)]
            entry["limits"] = {"tokens_per_minute": 50_000 + edit}
        texts.append(yaml.dump(raw, Dumper=_DUMPER, sort_keys=False))
    return texts


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


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


async def _bad_bodies(
    target: str, key: str, seconds: float, reload_pid: int, edits: list[tuple[Path, str]]
) -> tuple[list[float], list[float], dict[int, int]]:
    """One request at a time for 2 x `seconds`, in RELOADS rounds: a quiet window, then an
    edit written (`edits`: the policy's path and its next text), SIGHUP sent to
    `reload_pid` and a window as long while it reloads. Interleaved so that what else the
    machine does falls on both alike. Returns the client-timed milliseconds of each."""
    driver = SidecarDriver(target)
    windows: dict[str, list[float]] = {"quiet": [], "reloading": []}
    statuses: dict[int, int] = {}
    try:
        for path, text in edits[:RELOADS]:
            for window, times in windows.items():
                if window == "reloading":
                    staged = path.with_suffix(".next")
                    staged.write_text(text)
                    staged.replace(path)  # as an editor saves: the sidecar never reads half
                    os.kill(reload_pid, signal.SIGHUP)
                ends = time.perf_counter() + seconds / RELOADS
                while time.perf_counter() < ends:
                    t0 = time.perf_counter()
                    reply = await driver.decide(key, {}, raw=b'{"model": "m", "messages": [')
                    times.append((time.perf_counter() - t0) * 1000)
                    statuses[reply.status] = statuses.get(reply.status, 0) + 1
    finally:
        await driver.close()
    return windows["quiet"], windows["reloading"], statuses


def _serve_phase(name: str, source: Path, key: str, seconds: float, work: Path) -> dict[str, Any]:
    policy = work / f"serving-{source.name}"  # the copy the edits are written to
    policy.write_text(source.read_text())
    edits = [(policy, text) for text in operator_edits(source)]
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
        quiet, busy, statuses = asyncio.run(_bad_bodies(target, key, seconds, side.pid, edits))
        reloads = len(edits)
        deadline = time.monotonic() + 60
        while len(reload_times(side.log_text())) < reloads and time.monotonic() < deadline:
            time.sleep(0.2)
        reload_ms = reload_times(side.log_text())
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


def reload_times(log: str) -> list[float]:
    """Each reload's milliseconds, from a sidecar's log lines."""
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


TICK_S = 0.001  # how often the loop is asked to wake while a reload builds
RELOAD_WAYS = (
    "nothing (quiet, 1 s an edit)",
    "thread beside the loop",
    "builder, all of it sent",
    "builder, changes only",
)


async def _loop_gaps(source: Path, text: str, edits: list[str], work: Path) -> list[dict[str, Any]]:
    """Each of RELOAD_WAYS builds the edits of `source` (its `text`) one after the other
    while a ticker on the loop asks to wake every TICK_S; the time between its wakes (a
    loop held up wakes late). One way after
    the other, each on a file of its own: the builder keeps what it built, and a way that
    followed another edit by edit would find each edit already built."""
    rows = []
    for number, way in enumerate(RELOAD_WAYS):
        path = work / f"gaps-{number}-{source.name}"
        policy, digest = policy_from_text(text, str(path)), text_digest(str(path), text)
        known: str | None = text
        gaps: list[float] = []
        took: list[float] = []
        for edit in edits:
            path.write_text(edit)
            build: asyncio.Future[object]
            if number == 0:  # the baseline: the same ticker, nothing else on the loop
                build = asyncio.ensure_future(asyncio.sleep(1.0))
            elif number == 1:
                build = asyncio.ensure_future(off_loop(load_policy, path))
            elif number == 2:  # a digest it keeps nothing under: all of it comes
                build = asyncio.ensure_future(build_elsewhere(str(path), policy, "-", None))
            else:
                build = asyncio.ensure_future(build_elsewhere(str(path), policy, digest, known))
            started = last = time.perf_counter()
            while not build.done():
                await asyncio.sleep(TICK_S)
                now = time.perf_counter()
                gaps.append((now - last) * 1000)
                last = now
            took.append((time.perf_counter() - started) * 1000)
            built = build.result()
            if isinstance(built, Built):
                policy, digest, known = built.policy, built.digest, None
        rows.append(
            {
                "way": way,
                "reload_ms": statistics.median(took),
                "gap_p50_ms": quantile(gaps, 0.5),
                "gap_p99_ms": quantile(gaps, 0.99),
                "gap_max_ms": max(gaps),
                "gaps_over_5ms": sum(1 for g in gaps if g > 5.0),
                "ticks": len(gaps),
            }
        )
    return rows


def _gaps_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| reload built | reload ms (median) | between wakes p50 / p99 / max ms | over 5 ms |",
        "| --- | ---: | --- | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['way']} | {r['reload_ms']:.0f} | {r['gap_p50_ms']:.2f} / "
            f"{r['gap_p99_ms']:.2f} / {r['gap_max_ms']:.1f} | {r['gaps_over_5ms']} of "
            f"{r['ticks']} |"
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
    many = policies[f"{tenants}-tenants"]
    gaps = asyncio.run(_loop_gaps(many, many.read_text(), operator_edits(many), work))
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report = {
        "when": when,
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "rows": rows,
        "loop_gaps": gaps,
    }
    table = _table(report)
    gaps_table = _gaps_table(gaps)
    write_report(
        out_dir,
        "tenants",
        report,
        f"# A thousand tenants against the demo policy ({when})\n\n{os.cpu_count()} CPUs. "
        "load: `load_policy`, median of 3. start: `slogate serve` spawned to its ready line. "
        "decision: the body decision at the field mix, in process (as bench decision-cost), "
        "median p50 and worst p99 of two interleaved rounds. 400: a body the sidecar refuses "
        f"itself, one at a time over gRPC, timed by the client, {seconds:.0f} s alone and "
        f"{seconds:.0f} s while five reloads run, in five interleaved rounds (a quiet window, "
        "then an operator's edit, a key added and a tenant's limit changed, and a SIGHUP, and "
        "a window as long); each reload's time from the sidecar's log.\n\n"
        f"{table}\n\n"
        f"The event loop while a reload of the {tenants}-tenant policy builds, in process: "
        f"a ticker asks it to wake every {TICK_S * 1000:.0f} ms; the time between its wakes, "
        "over the "
        "same five edits built each way, one way after the other (the thread: as reloads "
        "were built before the builder process; all of it sent: what a builder that keeps "
        "nothing of the running policy sends, installed in slices).\n\n"
        f"{gaps_table}\n",
        indent=2,
    )
    print(table)
    print(gaps_table)
    return report
