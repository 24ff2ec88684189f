"""`slogate bench listeners`: what the way Envoy reaches the sidecar costs per request, TCP on
loopback (`serve --host 127.0.0.1`) or a Unix socket (`serve --grpc-socket`, Envoy's pipe
address), through a real Envoy and a real sidecar.

Both arms run side by side for the whole benchmark, each its own `slogate serve` (the same
bench policy: the example's plus a key that never runs out) and its own front Envoy (the same
bootstrap but for the sidecar's cluster), and one fixed-answer upstream Envoy behind both.
Rounds interleave the arms, their order alternating (ABBA), since a shared machine is noisy:
the idle arm costs nothing while the other is loaded. Each measurement is overhead.load's: a
warm-up, p50/p99 at one connection, req/s at 16 connections and the sidecar's and Envoy's CPU
per request meanwhile (from /proc). Reported: the medians of each arm and the median of the
rounds' paired ratios (Unix socket over TCP), which cancels what the machine did in a round.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extproc.runtime.processes import ManagedProcess
from tooling.benchmarks.levers import bench_policy
from tooling.benchmarks.overhead import _wrk_script, front_policy, load
from tooling.benchmarks.reports import write_report
from tooling.benchmarks.wrk import HOST, require_load_tools, start_envoy, upstream_bootstrap
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.stack.processes import free_port, start_sidecar

ARMS = ("tcp", "unix")
# What the table shows of each arm, as the report's keys name them (overhead.load's).
SHOWN = (
    ("cpu_us_per_request_sidecar", "sidecar CPU µs/req (16 conns)"),
    ("cpu_us_per_request_envoy", "Envoy CPU µs/req (16 conns)"),
    ("rps_16", "req/s (16 conns)"),
    ("p50_ms", "p50 ms (1 conn)"),
    ("p99_ms", "p99 ms (1 conn)"),
    ("p99_ms_16", "p99 ms (16 conns)"),
)


def start_arm(
    arm: str, work: Path, policy_path: Path, upstream_port: int
) -> tuple[str, dict[str, int | None], list[ManagedProcess]]:
    """The arm's sidecar and front Envoy: its URL, their pids, the processes to stop."""
    socket_path = work / f"{arm}.sock"
    extra = ("--grpc-socket", str(socket_path)) if arm == "unix" else ()
    side, ports = start_sidecar(
        work, policy_path, f"sidecar-{arm}", exact_tokenizer=True, extra_args=extra
    )
    listen, admin = free_port(), free_port()
    envoy_ports = EnvoyPorts(
        listen,
        admin,
        ports.grpc,
        HOST,
        sidecar_socket=str(socket_path) if arm == "unix" else None,
    )
    config = build_bootstrap(front_policy(policy_path, upstream_port), envoy_ports)
    try:
        envoy = start_envoy(f"envoy-{arm}", config, admin, work)
    except BaseException:
        side.stop()
        raise
    url = f"http://{HOST}:{listen}/v1/chat/completions"
    return url, {"sidecar": side.pid, "envoy": envoy.pid}, [side, envoy]


def paired_ratios(runs: Mapping[str, list[dict[str, float]]]) -> dict[str, float]:
    """Median over the rounds of Unix socket over TCP, per measure: each round's two arms
    ran within seconds of each other, on the same machine load."""
    return {
        key: statistics.median(
            unix[key] / tcp[key] for tcp, unix in zip(runs["tcp"], runs["unix"], strict=True)
        )
        for key, _ in SHOWN
    }


def table(
    summary: Mapping[str, Mapping[str, float]],
    ratios: Mapping[str, float],
    runs: Mapping[str, list[dict[str, float]]],
) -> str:
    lines = [
        "| measure | TCP loopback | Unix socket | Unix / TCP (median of paired rounds) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in SHOWN:
        tcp, unix = summary["tcp"][key], summary["unix"][key]
        digits = 0 if key.startswith(("cpu", "rps")) else 2
        lines.append(f"| {label} | {tcp:.{digits}f} | {unix:.{digits}f} | {ratios[key]:.3f} |")
    non_2xx = {arm: sum(r["non_2xx"] for r in rows) for arm, rows in runs.items()}
    lines.append(f"| non-2xx (all rounds) | {non_2xx['tcp']:.0f} | {non_2xx['unix']:.0f} | |")
    return "\n".join(lines)


def run(
    out_dir: Path,
    duration_s: float = 5.0,
    rounds: int = 4,
    profile: str = "small",
    name: str = "listeners",
) -> dict[str, Any]:
    require_load_tools()
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-listeners-"))
    policy_path = bench_policy(work)
    script = _wrk_script(work, profile)
    upstream_port, upstream_admin = free_port(), free_port()
    procs = [
        start_envoy(
            "upstream", upstream_bootstrap(upstream_port, upstream_admin), upstream_admin, work
        )
    ]
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    load_before = os.getloadavg()
    try:
        arms = {}
        for arm in ARMS:
            url, pids, started = start_arm(arm, work, policy_path, upstream_port)
            procs += started
            arms[arm] = (url, pids)
        for index in range(rounds):
            for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
                url, pids = arms[arm]
                result = load(url, duration_s, script, pids)
                runs[arm].append(result)
                print(f"round {index + 1} {arm}: {result}", flush=True)
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    summary = {
        arm: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for arm, rows in runs.items()
    }
    ratios = paired_ratios(runs)
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "profile": profile,
        "duration_s": duration_s,
        "rounds": rounds,
        "summary_median": summary,
        "unix_over_tcp_paired_median": ratios,
        "runs": runs,
    }
    shown = table(summary, ratios, runs)
    write_report(
        out_dir,
        name,
        report,
        f"# Envoy to the sidecar: TCP loopback vs a Unix socket ({report['when']})\n\n"
        f"{report['cpus']} CPUs (1-minute load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after: other work shared the machine), body profile {profile}, "
        f"one sidecar and one front Envoy (1 worker thread) per arm, {rounds} interleaved "
        f"rounds of {duration_s:g} s per measure, medians. The ratio column is the median of "
        "each round's Unix socket over TCP (below 1: the socket costs less).\n\n"
        f"{shown}\n",
        indent=2,
    )
    print(shown)
    return report
