"""`slogate bench stages`: what the sidecar costs per request, stage by stage, beside the
pass-through ext_proc on the same bodies, Envoy and upstream.

Three measurements per processor (the pass-through, slogate), each at 16 connections:
- its threads' CPU per request (unprofiled; /proc/PID/task/*/stat): the event loop's thread
  (where every Python line of the request path runs), gRPC core's threads, the counting
  workers;
- a deterministic profile (yappi, CPU clock, tooling.benchmarks.yappi_serve): every
  function's own time, grouped into the stages of the request path (STAGES, by the file it
  lives in), and how many event-loop callbacks and tasks a request costs. yappi's timing
  inflates Python calls (~3x), so its shares are scaled to the loop thread's unprofiled CPU:
  a stage's µs = its share of the profile x the loop thread's µs per request;
- py-spy samples of the unprofiled slogate (tooling.benchmarks.profile): the same question
  asked by sampling, which charges C extensions to their Python caller.

`product_tree`: profile another checkout's sidecar (a git worktree of the baseline commit)
with this checkout's benchmark: the before of a before/after.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import pstats
import signal
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.runtime.processes import ManagedProcess, python_module
from tooling.benchmarks import overhead
from tooling.benchmarks.levers import bench_policy
from tooling.benchmarks.profile import available as spy_available
from tooling.benchmarks.profile import record, summarise
from tooling.benchmarks.profile import table as spy_table
from tooling.benchmarks.reports import write_report
from tooling.benchmarks.wrk import start_envoy, upstream_bootstrap, wrk
from tooling.render.envoy_config.profile import FilterProfile
from tooling.stack.processes import free_port, start_sidecar

PROCESSORS = ("passthrough", "slogate")
_YAPPI_SERVE = Path(__file__).with_name("yappi_serve.py")


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    markers: tuple[str, ...]  # a function whose file path holds any of these


# First match wins: the specific before the general (the access log's metrics are
# metrics; a count's numpy is counting only where it is called from, so numpy is its own).
STAGES = (
    Stage("prompt counting", ("extproc/request/tokens/",)),
    Stage(
        "metrics",
        ("prometheus_client/", "service/metrics.py", "genai_metrics.py", "tenant_", "known_"),
    ),
    Stage(
        "access log and settling",
        ("service/access_log.py", "decision_log.py", "traffic_record.py", "admission/signals"),
    ),
    Stage("body parsing and rewriting", ("extproc/request/bodies/",)),
    Stage("budgets", ("budget/", "admission/budget_step.py", "admission/spend")),
    Stage("KV admission and waiting room", ("admission/kv/", "admission/waiting_room.py")),
    Stage("breaker", ("breaker/", "admission/breaker_step.py")),
    Stage("admission chain, access, decision", ("admission/",)),
    Stage("engine picking and prefix hashing", ("engines/",)),
    Stage("identity, routing, request flow", ("extproc/request/",)),
    Stage("policy lookups", ("policy/",)),
    Stage("protobuf replies", ("service/replies.py", "service/one_message.py", "protobuf")),
    Stage("ext_proc servicer", ("service/ext_proc.py", "service/eager.py")),
    Stage("dataclass copies and inits", ("dataclasses.py", "<string>")),
    Stage(
        "event loop and grpc.aio (cygrpc inside)",
        ("asyncio/", "selectors.py", "grpc", "_weakrefset.py", "contextvars", "inspect.py"),
    ),
    Stage("threads (pool, locks)", ("threading.py", "concurrent/")),
)
OTHER = "other"


def stage_of(path: str) -> str:
    for stage in STAGES:
        if any(marker in path for marker in stage.markers):
            return stage.name
    return OTHER


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of one process (threads of one name summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def _thread_kind(name: str, main_name: str) -> str:
    if name == main_name:
        return "event loop thread"
    if name.startswith(("event_engine", "grpc", "default-executo", "resolver")):
        return "gRPC core threads"
    if name.startswith(("fastokens", "ThreadPoolExecutor", "count")):
        return "counting workers"
    return "other threads"


def profile_stages(path: Path, requests: int) -> dict[str, Any]:
    """A yappi profile's own time per stage (µs per request, as yappi timed it, and the
    share), its function calls, event-loop callbacks and tasks per request."""
    stats = pstats.Stats(str(path))
    own: dict[str, float] = {}
    calls = callbacks = tasks = 0
    for (file, _line, function), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(file)
        own[stage] = own.get(stage, 0.0) + tottime
        calls += ncalls
        if file.endswith("asyncio/events.py") and function == "Handle._run":
            callbacks += ncalls
        if function.endswith("Loop.create_task"):
            tasks += ncalls
    total = sum(own.values()) or 1.0
    return {
        "requests": requests,
        "yappi_us_per_request": total / requests * 1e6,
        "share": {stage: value / total for stage, value in own.items()},
        "calls_per_request": calls / requests,
        "loop_callbacks_per_request": callbacks / requests,
        "tasks_per_request": tasks / requests,
    }


def _start_processor(
    processor: str,
    work: Path,
    profiled: Path | None,
    product_tree: Path | None,
) -> tuple[ManagedProcess, int, Path]:
    """The pass-through or the sidecar; under yappi when `profiled` (its pstats path)."""
    env: dict[str, str] = {}
    if product_tree is not None:
        env["PYTHONPATH"] = str(product_tree)
    if profiled is not None:
        env["SLOGATE_YAPPI_OUT"] = str(profiled)
    runner = str(_YAPPI_SERVE) if profiled is not None else None
    if processor == "passthrough":
        argv = python_module("tooling.benchmarks.passthrough", "--port", "0", runner=runner)
        side = ManagedProcess(f"{processor}-extproc", argv, work, env or None).start()
        return side, int(side.wait_for_line(r"grpc [^:]+:(\d+)").group(1)), overhead.POLICY
    policy = bench_policy(work, None)
    side, ports = start_sidecar(
        work, policy, "sidecar", exact_tokenizer=True, env=env or None, runner=runner
    )
    return side, ports.grpc, policy


def measure(
    processor: str,
    profile: str,
    seconds: float,
    work: Path,
    upstream_port: int,
    script: Path,
    profiled: bool,
    product_tree: Path | None = None,
    spy_out: Path | None = None,
) -> dict[str, Any]:
    """One run at 16 connections: threads' CPU per request, or (profiled) the profile."""
    pstat = work / f"yappi-{processor}-{profile}.pstat" if profiled else None
    side, grpc_port, policy = _start_processor(processor, work, pstat, product_tree)
    filters = FilterProfile.EXT_PROC_ONLY if processor == "passthrough" else FilterProfile.SLOGATE
    envoy: ManagedProcess | None = None
    try:
        url, envoy = overhead.front_envoy(
            f"{processor}-envoy", upstream_port, grpc_port, work, filters, policy_path=policy
        )
        wrk(url, 4, 2.0, script)  # warm-up
        assert side.pid is not None
        main_name = thread_cpu_s_main_name(side.pid)
        before = thread_cpu_s(side.pid)
        if pstat is not None:
            os.kill(side.pid, signal.SIGUSR1)
        spy = record(side.pid, seconds - 1, spy_out) if spy_out is not None else None
        loaded = wrk(url, 16, seconds, script)
        if spy is not None:
            spy.wait(timeout=60)
        if pstat is not None:
            os.kill(side.pid, signal.SIGUSR1)
        after = thread_cpu_s(side.pid)
        requests = max(1, int(loaded["requests"]))
        threads: dict[str, float] = {}
        for name, used in after.items():
            kind = _thread_kind(name, main_name)
            spent = (used - before.get(name, 0.0)) / requests * 1e6
            threads[kind] = threads.get(kind, 0.0) + spent
        result: dict[str, Any] = {
            "rps": loaded["rps"],
            "requests": requests,
            "non_2xx": loaded["non_2xx"],
            "threads_us_per_request": threads,
        }
        if pstat is not None:
            _wait_for(pstat)
            result["profile"] = profile_stages(pstat, requests)
        return result
    finally:
        if envoy is not None:
            envoy.stop()
        side.stop()


def thread_cpu_s_main_name(pid: int) -> str:
    """The main thread's name (the process's own: its thread id is its pid)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def _wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.5)  # the save may still be writing
            return
        time.sleep(0.1)
    raise RuntimeError(f"no profile at {path}")


def run(
    out_dir: Path,
    seconds: float = 6.0,
    rounds: int = 3,
    profiles: Sequence[str] = ("field_mix", "small"),
    name: str = "stages",
    product_tree: Path | None = None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-stages-"))
    upstream_port, upstream_admin = free_port(), free_port()
    upstream = start_envoy(
        "upstream", upstream_bootstrap(upstream_port, upstream_admin), upstream_admin, work
    )
    plain: dict[str, dict[str, list[dict[str, Any]]]] = {
        p: {processor: [] for processor in PROCESSORS} for p in profiles
    }
    profiled: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in profiles}
    spying = spy_available()
    try:
        scripts = {p: overhead._wrk_script(work, p) for p in profiles}
        for round_index in range(rounds):
            for p in profiles:
                for processor in PROCESSORS:
                    spy_out = (
                        work / f"spy-{p}.txt"
                        if spying and processor == "slogate" and round_index == rounds - 1
                        else None
                    )
                    result = measure(
                        processor, p, seconds, work, upstream_port, scripts[p], False,
                        product_tree, spy_out,
                    )  # fmt: skip
                    plain[p][processor].append(result)
                    print(f"round {round_index + 1} {p} {processor}: {result}", flush=True)
        for p in profiles:
            for processor in PROCESSORS:
                profiled[p][processor] = measure(
                    processor, p, seconds, work, upstream_port, scripts[p], True, product_tree
                )
                print(f"profiled {p} {processor}: {profiled[p][processor]}", flush=True)
    finally:
        upstream.stop()
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "product_tree": str(product_tree) if product_tree is not None else None,
        "seconds": seconds,
        "rounds": rounds,
        "threads_median": {
            p: {processor: _median_threads(runs) for processor, runs in by.items()}
            for p, by in plain.items()
        },
        "rps_median": {
            p: {
                processor: statistics.median(r["rps"] for r in runs)
                for processor, runs in by.items()
            }
            for p, by in plain.items()
        },
        "profiles": profiled,
        "py_spy": {
            p: summarise(work / f"spy-{p}.txt")
            for p in profiles
            if (work / f"spy-{p}.txt").exists()
        },
        "runs": plain,
    }
    write_report(out_dir, name, report, markdown(report))
    print(markdown(report))
    return report


def _median_threads(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    kinds = {kind for r in runs for kind in r["threads_us_per_request"]}
    return {
        kind: statistics.median(r["threads_us_per_request"].get(kind, 0.0) for r in runs)
        for kind in sorted(kinds)
    }


def stage_table(report: Mapping[str, Any], profile: str) -> list[tuple[str, float, float, float]]:
    """(stage, slogate µs per request, its share, the pass-through's µs) at `profile`: each
    profile's shares times its loop thread's unprofiled CPU per request."""
    threads = report["threads_median"][profile]
    rows: dict[str, list[float]] = {}
    for index, processor in enumerate(PROCESSORS):
        loop_us = threads[processor].get("event loop thread", 0.0)
        share = report["profiles"][profile][processor]["profile"]["share"]
        for stage, fraction in share.items():
            rows.setdefault(stage, [0.0, 0.0, 0.0])
            rows[stage][2 if index == 0 else 0] = fraction * loop_us
            if index == 1:
                rows[stage][1] = fraction
    ordered = sorted(rows.items(), key=lambda item: -item[1][0])
    return [(stage, ours, share, base) for stage, (ours, share, base) in ordered]


def markdown(report: Mapping[str, Any]) -> str:
    tree = report.get("product_tree")
    lines = [
        f"# Sidecar cost per stage ({report['when']})",
        "",
        f"{report['machine']['cpus']} CPUs, Python {report['machine']['python']}; "
        f"{report['rounds']} interleaved rounds of {report['seconds']:g} s at 16 connections "
        "(medians), then one yappi-profiled run of each. Same Envoy, upstream and bodies as "
        "`bench overhead`. "
        + (f"Product code from {tree} (the baseline). " if tree else "")
        + "Stage µs = the stage's share of the yappi profile (own time of the functions in "
        "its files, tooling/benchmarks/stages.py STAGES) x the event loop thread's "
        "unprofiled CPU per request; the threads' rows are measured, not scaled.",
        "",
    ]
    for profile in report["threads_median"]:
        threads = report["threads_median"][profile]
        rps = report["rps_median"][profile]
        lines += [f"## {profile}", ""]
        lines += [
            "| CPU per request (µs) | pass-through | slogate | slogate / pass-through |",
            "| --- | ---: | ---: | ---: |",
        ]
        kinds = sorted({*threads["passthrough"], *threads["slogate"]})
        totals = [sum(threads[p].values()) for p in PROCESSORS]
        for kind in kinds:
            base, ours = threads["passthrough"].get(kind, 0.0), threads["slogate"].get(kind, 0.0)
            ratio = f"{ours / base:.2f}x" if base else "-"
            lines.append(f"| {kind} | {base:.0f} | {ours:.0f} | {ratio} |")
        lines.append(
            f"| **all threads** | **{totals[0]:.0f}** | **{totals[1]:.0f}** "
            f"| **{totals[1] / max(totals[0], 1e-9):.2f}x** |"
        )
        lines.append(
            f"| req/s at 16 connections | {rps['passthrough']:.0f} | {rps['slogate']:.0f} "
            f"| {rps['slogate'] / max(rps['passthrough'], 1e-9):.2f}x |"
        )
        prof = {p: report["profiles"][profile][p]["profile"] for p in PROCESSORS}
        for key, label in (
            ("loop_callbacks_per_request", "event-loop callbacks per request (yappi)"),
            ("tasks_per_request", "tasks per request (yappi)"),
            ("calls_per_request", "Python calls per request (yappi)"),
        ):
            lines.append(
                f"| {label} | {prof['passthrough'][key]:.1f} | {prof['slogate'][key]:.1f} | - |"
            )
        lines += [
            "",
            "| stage (event loop thread) | slogate µs/req | share | pass-through µs/req |",
            "| --- | ---: | ---: | ---: |",
        ]
        for stage, ours, share, base in stage_table(report, profile):
            lines.append(f"| {stage} | {ours:.0f} | {share:.1%} | {base:.0f} |")
        lines.append("")
    if report.get("py_spy"):
        lines += ["## py-spy on the unprofiled sidecar (last round)", ""]
        lines.append(spy_table(report["py_spy"]))
    return "\n".join(lines) + "\n"
