"""`slogate bench tracing`: what a span per decision costs the sidecar.

The same `slogate serve` with `telemetry.tracing` off and on (every request carrying a
sampled client `traceparent`, so every decision gets a span: the worst case), in
interleaved rounds. Each round drives the sidecar over real gRPC as Envoy does
(tooling.benchmarks.driver: headers, body, then the access-log entries that settle the
requests) with a few requests in flight, and reads the sidecar process's CPU time from
/proc before and after; with tracing on, "after" is once the receiver (a real OTLP/gRPC
collector in this process, tooling.stack.otlp_receiver) holds every span, so the exporter's
thread is counted. Per-decision CPU = CPU seconds / requests. Writes
bench/results/tracing.{md,json}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from policy.quantiles import quantile
from tooling.benchmarks.driver import SidecarDriver
from tooling.benchmarks.levers import BENCH_KEY, bench_policy
from tooling.benchmarks.reports import write_report
from tooling.stack.otlp_receiver import TraceReceiver
from tooling.stack.processes import proc_stat, start_sidecar

VARIANTS = ("off", "on")
WARM = 200  # requests before a round's measurement
MEDIANS = ("cpu_us_per_decision", "latency_p50_ms", "latency_p99_ms", "decisions_per_s")
# The exporter as operators get it: the SDK's defaults (a batch when 512 spans are queued
# or 5 s passed, a queue of 2048). A 200 ms delay measured the same (+167 us, 1.10x).
BATCH_DELAY_MS = "5000"


def _body(index: int) -> dict[str, Any]:
    """A short chat (about 100 prompt tokens), each a little different."""
    text = f"Request {index}: summarise the following notes. " + "The fleet is healthy. " * 20
    return {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 64,
    }


async def _drive(target: str, requests: int, concurrency: int, first: int) -> list[float]:
    """`requests` decisions, `concurrency` at a time, each settled; the client's ms each."""
    driver = SidecarDriver(target)
    latencies_ms: list[float] = []
    tracked: list[tuple[str, str, int, int | None, int | None]] = []
    queue = iter(range(first, first + requests))

    async def worker() -> None:
        for index in queue:
            traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            started = time.perf_counter()
            reply = await driver.decide(
                BENCH_KEY,
                _body(index),
                headers={"traceparent": traceparent, "x-request-id": f"bench-{index}"},
            )
            latencies_ms.append((time.perf_counter() - started) * 1000)
            if reply.tracking_id:
                tracked.append(reply.outcome(200, 100, 64))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await driver.report(tracked)
    await driver.close()
    return latencies_ms


def _round(
    work: Path, variant: str, receiver: TraceReceiver, requests: int, concurrency: int
) -> dict[str, Any]:
    changes: dict[str, Any] = {"breaker": {"scrape_metrics": False}}  # no engines run here
    if variant == "on":
        changes["telemetry"] = {"tracing": {"otlp_endpoint": receiver.endpoint}}
    policy = bench_policy(work, changes)
    proc, ports = start_sidecar(
        work,
        policy,
        name=f"sidecar-{variant}",
        admin_port=0,
        exact_tokenizer=True,
        env={"OTEL_BSP_SCHEDULE_DELAY": BATCH_DELAY_MS},
    )
    target = f"127.0.0.1:{ports.grpc}"
    try:
        assert proc.pid is not None
        before_spans = len(receiver.spans()) + (WARM if variant == "on" else 0)
        asyncio.run(_drive(target, WARM, concurrency, 0))  # caches, code paths
        receiver.wait_for(before_spans, timeout_s=30)  # the warm spans are not counted
        before = proc_stat(proc.pid)
        started = time.monotonic()
        latencies = asyncio.run(_drive(target, requests, concurrency, 1_000_000))
        driven_s = time.monotonic() - started
        if variant == "on":
            receiver.wait_for(before_spans + requests, timeout_s=30)
        after = proc_stat(proc.pid)
    finally:
        proc.stop()
    assert before is not None and after is not None
    spans = len(receiver.spans()) - before_spans
    return {
        "variant": variant,
        "requests": requests,
        "cpu_s": after[1] - before[1],
        "cpu_us_per_decision": (after[1] - before[1]) / requests * 1e6,
        "latency_p50_ms": quantile(latencies, 0.5),
        "latency_p99_ms": quantile(latencies, 0.99),
        "decisions_per_s": requests / driven_s,
        "spans": spans,
    }


def on_the_loop(receiver: TraceReceiver, calls: int = 2000) -> dict[str, float]:
    """What a traced decision adds on the sidecar's event loop, in this process: the
    client's context read from the headers, the span made, ended and its id written into
    the reply; CPU of the calling thread only (the exporter's thread runs beside it).
    Medians of 5 runs of `calls`."""
    from admission.decision import CountKind, RoutingDecision
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed
    from extproc.service.tracing import DecisionTracer
    from policy._telemetry import TracingConfig
    from policy.domain import ApiKey, Tier
    from policy.loader import load_policy
    from tooling.benchmarks.levers import POLICY

    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = BATCH_DELAY_MS
    policy = load_policy(POLICY)
    tracer = DecisionTracer(TracingConfig(receiver.endpoint))
    caller = ApiKey(key_sha256="0" * 64, tenant="bench", tier=Tier.STANDARD)
    decision = RoutingDecision(
        "bench", caller, "default", policy.bucket_for(164), 100, 64, CountKind.EXACT, False
    )
    routed = Routed(decision, "t-1")
    headers = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01", "x-request-id": "bench"}
    flow: Any = SimpleNamespace(arrived_s=time.time(), request_id="bench", shape=decision)
    runs = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(calls):
            reply = pb.ProcessingResponse()
            reply.request_body.SetInParent()
            flow.trace_parent = tracer.parent(headers)
            tracer.routed(flow, routed, reply)
        runs.append((time.thread_time() - started) / calls * 1e6)
        time.sleep(1.0)  # the exporter sends them all (its queue holds 2048)
    tracer.close()
    return {"us_per_decision": statistics.median(runs), "calls": calls}


def run(
    out_dir: Path, requests: int = 3000, rounds: int = 5, concurrency: int = 4
) -> dict[str, Any]:
    receiver = TraceReceiver().start()
    results: list[dict[str, Any]] = []
    try:
        loop_cost = on_the_loop(receiver)
        with tempfile.TemporaryDirectory(prefix="slogate-bench-tracing-") as tmp:
            for index in range(rounds):
                # Interleaved, and the order alternated: a drift of the machine hits both.
                order = VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    result = _round(Path(tmp), variant, receiver, requests, concurrency)
                    result["round"] = index
                    results.append(result)
                    print(json.dumps(result))
    finally:
        receiver.stop()
    summary = {
        variant: {
            key: statistics.median(r[key] for r in results if r["variant"] == variant)
            for key in MEDIANS
        }
        for variant in VARIANTS
    }
    off, on = summary["off"], summary["on"]
    report = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "requests": requests,
        "rounds": rounds,
        "concurrency": concurrency,
        "rounds_data": results,
        "median": summary,
        "cpu_ratio_on_off": on["cpu_us_per_decision"] / off["cpu_us_per_decision"],
        "cpu_us_added": on["cpu_us_per_decision"] - off["cpu_us_per_decision"],
        "on_the_loop": loop_cost,
    }
    write_report(out_dir, "tracing", report, _markdown(report))
    print(_markdown(report))
    return report


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Tracing cost ({report['when']})",
        "",
        f"{report['cpus']} CPUs; `slogate serve` (exact prompt counter, the example policy "
        f"with a bench key) driven over real gRPC as Envoy does: {report['requests']} "
        f"requests a round, {report['concurrency']} in flight, ~100-token chats, each settled "
        f"by its access-log entry; {report['rounds']} rounds, off and on interleaved. On: "
        "`telemetry.tracing` to a real OTLP/gRPC receiver, every request with a sampled "
        "client traceparent (a span per decision, BatchSpanProcessor). CPU = the sidecar "
        "process's utime + stime over the round (the exporter's thread included), per request.",
        "",
        "| round | tracing | CPU µs / decision | client p50 ms | client p99 ms | decisions/s "
        "| spans received |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["rounds_data"]:
        lines.append(
            f"| {r['round']} | {r['variant']} | {r['cpu_us_per_decision']:.0f} | "
            f"{r['latency_p50_ms']:.2f} | {r['latency_p99_ms']:.2f} | "
            f"{r['decisions_per_s']:.0f} | {r['spans']} |"
        )
    off, on = report["median"]["off"], report["median"]["on"]
    lines += [
        "",
        "Medians over the rounds:",
        "",
        "| tracing | CPU µs / decision | client p50 ms | client p99 ms | decisions/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, m in (("off", off), ("on", on)):
        lines.append(
            f"| {name} | {m['cpu_us_per_decision']:.0f} | {m['latency_p50_ms']:.2f} | "
            f"{m['latency_p99_ms']:.2f} | {m['decisions_per_s']:.0f} |"
        )
    lines += [
        "",
        f"Tracing on costs {report['cpu_us_added']:.0f} µs of sidecar CPU per decision "
        f"({report['cpu_ratio_on_off']:.2f}x the CPU with it off). Of it, on the event "
        f"loop (in-process, the calling thread's CPU: context read, span made and ended, "
        f"traceparent written into the reply; median of 5 x {report['on_the_loop']['calls']}): "
        f"{report['on_the_loop']['us_per_decision']:.1f} µs per decision; the rest is the "
        "exporter's thread (batching, protobuf, gRPC).",
        "",
    ]
    return "\n".join(lines)
