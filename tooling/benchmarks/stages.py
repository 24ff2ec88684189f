"""`slogate bench stages`: what the sidecar costs per request, stage by stage, beside the
pass-through ext_proc on the same bodies, Envoy and upstream.

Three measurements per processor (the pass-through, slogate), each at 16 connections:
- its threads' CPU per request (unprofiled; /proc/PID/task/*/stat): the event loop's thread
  (where every Python line of the request path runs), gRPC core's threads, the counting
  workers;
- a deterministic profile (yappi, CPU clock, tooling.benchmarks.yappi_serve): every
  function's own time, grouped into the stages of the request path
  (tooling.benchmarks.stage_map.STAGES, by the file it lives in), and how many event-loop
  callbacks and tasks a request costs. yappi's timing
  inflates Python calls (~3x), so its shares are scaled to the loop thread's unprofiled CPU:
  a stage's µs = its share of the profile x the loop thread's µs per request;
- py-spy samples of the unprofiled slogate (tooling.benchmarks.profile): the same question
  asked by sampling, which charges C extensions to their Python caller.

And in process (tooling.benchmarks.request_path): the servicers driven with Envoy's
messages, no gRPC, CPU per phase (header message, body message, access-log entry) and a
cProfile of the same requests grouped into the same stages: the most repeatable number
on a shared machine.

`baseline`: another checkout (a git worktree of the baseline commit) measured beside this
one in every round, with this checkout's benchmark: the before of a before/after.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import pstats
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extproc.runtime.processes import ManagedProcess, python_module
from tooling.benchmarks import overhead, request_path
from tooling.benchmarks.levers import bench_policy
from tooling.benchmarks.profile import available as spy_available
from tooling.benchmarks.profile import record, summarise
from tooling.benchmarks.reports import write_report
from tooling.benchmarks.stage_map import shares, stage_of
from tooling.benchmarks.stages_report import markdown
from tooling.benchmarks.wrk import start_envoy, upstream_bootstrap, wrk
from tooling.render.envoy_config.profile import FilterProfile
from tooling.stack.processes import free_port, start_sidecar

PROCESSORS = ("passthrough", "slogate")
BASELINE = "baseline"
ONE_MESSAGE = "slogate_one_message"  # in process: this checkout, Envoy's body message alone
_YAPPI_SERVE = Path(__file__).with_name("yappi_serve.py")


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
    processor: str, work: Path, profiled: Path | None, baseline: Path | None
) -> tuple[ManagedProcess, int, Path]:
    """The pass-through, this checkout's sidecar or the baseline's (`baseline`'s packages
    first on its path); under yappi when `profiled` (its pstats path)."""
    env: dict[str, str] = {}
    if processor == BASELINE:
        assert baseline is not None
        env["PYTHONPATH"] = str(baseline)
    if profiled is not None:
        env["SLOGATE_YAPPI_OUT"] = str(profiled)
    runner = str(_YAPPI_SERVE) if profiled is not None else None
    if processor == "passthrough":
        argv = python_module("tooling.benchmarks.passthrough", "--port", "0", runner=runner)
        side = ManagedProcess(f"{processor}-extproc", argv, work, env or None).start()
        return side, int(side.wait_for_line(r"grpc [^:]+:(\d+)").group(1)), overhead.POLICY
    policy = bench_policy(work, None)
    side, ports = start_sidecar(
        work, policy, f"{processor}-sidecar", exact_tokenizer=True, env=env or None, runner=runner
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
    baseline: Path | None = None,
    spy_out: Path | None = None,
) -> dict[str, Any]:
    """One run at 16 connections: threads' CPU per request, or (profiled) the profile."""
    pstat = work / f"yappi-{processor}-{profile}.pstat" if profiled else None
    side, grpc_port, policy = _start_processor(processor, work, pstat, baseline)
    filters = FilterProfile.EXT_PROC_ONLY if processor == "passthrough" else FilterProfile.SLOGATE
    envoy: ManagedProcess | None = None
    try:
        url, envoy = overhead.front_envoy(
            f"{processor}-envoy", upstream_port, grpc_port, work, filters, policy_path=policy
        )
        wrk(url, 4, 2.0, script)  # warm-up
        assert side.pid is not None
        main_name = _main_thread_name(side.pid)
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


def _main_thread_name(pid: int) -> str:
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


def in_process(
    profiles: Sequence[str],
    requests: int,
    rounds: int,
    work: Path,
    baseline: Path | None,
    one_message: bool = False,
) -> dict[str, Any]:
    """The request path in process, this checkout and the baseline taking turns each
    round: CPU µs per phase (median of the rounds' means), and a cProfile's stage shares;
    `one_message`: this checkout again with one ext_proc message per request (ONE_MESSAGE:
    its header phase is in its request_body's)."""
    # Each arm in a fresh process of its own, this checkout's too: one process running
    # round after round would count texts its tokenizer has seen before (the bodies repeat
    # from round to round), and it would not be the baseline's equal.
    here = Path(__file__).resolve().parents[2]
    arms = {"slogate": here, **({ONE_MESSAGE: here} if one_message else {})}
    arms.update({BASELINE: baseline} if baseline is not None else {})
    found: dict[str, Any] = {}
    for profile in profiles:
        means: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
        for round_index in range(rounds):
            for arm, tree in arms.items():
                last = round_index == rounds - 1
                dump = work / f"cprofile-{arm}-{profile}.prof" if last else None
                phases = request_path.measure(profile, requests, tree, dump, arm == ONE_MESSAGE)
                for phase, row in phases.items():
                    means[arm].setdefault(phase, []).append(row["mean_us"])
                print(f"in process {profile} {arm} round {round_index + 1}: {phases}", flush=True)
        found[profile] = {
            arm: {
                "cpu_us_per_request": {
                    phase: statistics.median(values) for phase, values in by_phase.items()
                },
                "stage_share": shares(
                    request_path.own_time(work / f"cprofile-{arm}-{profile}.prof", stage_of)
                ),
            }
            for arm, by_phase in means.items()
        }
    return found


def run(
    out_dir: Path,
    seconds: float = 6.0,
    rounds: int = 3,
    profiles: Sequence[str] = ("field_mix", "small"),
    name: str = "stages",
    baseline: Path | None = None,
    requests: int = 1500,
    live: bool = True,
    one_message: bool = False,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-stages-"))
    processors = (*PROCESSORS, *((BASELINE,) if baseline is not None else ()))
    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": str(baseline) if baseline is not None else None,
        "baseline_commit": _commit(baseline),
        "commit": _commit(Path.cwd()),
        "seconds": seconds,
        "rounds": rounds,
        "requests_in_process": requests,
        "in_process": in_process(profiles, requests, rounds, work, baseline, one_message),
    }
    if live:
        report.update(_live(work, profiles, processors, seconds, rounds, baseline))
    write_report(out_dir, name, report, markdown(report))
    print(markdown(report))
    return report


def _live(
    work: Path,
    profiles: Sequence[str],
    processors: Sequence[str],
    seconds: float,
    rounds: int,
    baseline: Path | None,
) -> dict[str, Any]:
    """Through Envoy and gRPC at 16 connections: every processor per round (interleaved),
    then one yappi-profiled run of each, py-spy on this checkout's in the last round."""
    upstream_port, upstream_admin = free_port(), free_port()
    upstream = start_envoy(
        "upstream", upstream_bootstrap(upstream_port, upstream_admin), upstream_admin, work
    )
    plain: dict[str, dict[str, list[dict[str, Any]]]] = {
        p: {processor: [] for processor in processors} for p in profiles
    }
    profiled: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in profiles}
    spying = spy_available()
    try:
        scripts = {p: overhead._wrk_script(work, p) for p in profiles}
        for round_index in range(rounds):
            for p in profiles:
                for processor in processors:
                    last = spying and processor == "slogate" and round_index == rounds - 1
                    result = measure(
                        processor, p, seconds, work, upstream_port, scripts[p], False,
                        baseline, work / f"spy-{p}.txt" if last else None,
                    )  # fmt: skip
                    plain[p][processor].append(result)
                    print(f"round {round_index + 1} {p} {processor}: {result}", flush=True)
        for p in profiles:
            for processor in processors:
                profiled[p][processor] = measure(
                    processor, p, seconds, work, upstream_port, scripts[p], True, baseline
                )
                print(f"profiled {p} {processor}: {profiled[p][processor]}", flush=True)
    finally:
        upstream.stop()
    return {
        "threads_median": {
            p: {processor: _median_threads(runs) for processor, runs in by.items()}
            for p, by in plain.items()
        },
        "rps_median": {
            p: {proc: statistics.median(r["rps"] for r in runs) for proc, runs in by.items()}
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


def _commit(tree: Path | None) -> str | None:
    if tree is None:
        return None
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


def _median_threads(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    kinds = {kind for r in runs for kind in r["threads_us_per_request"]}
    return {
        kind: statistics.median(r["threads_us_per_request"].get(kind, 0.0) for r in runs)
        for kind in sorted(kinds)
    }
