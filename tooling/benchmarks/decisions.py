"""`slogate bench decisions`: what one budget decision costs, per store, in one run.

For the in-process store and the Redis store (a real valkey/redis server started here,
one EVALSHA round trip per decision) it measures reserve and settle latency one at a
time (p50/p99) and reservations per second with 64 in flight. A bare Redis PING round
trip from the same client is the baseline the Redis numbers are read against.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from budget.ledger import Charge
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore, InProcessStore
from policy import Limits
from tooling.processes import start_redis

LIMITS = Limits(
    requests_per_minute=10**9,
    tokens_per_minute=10**12,
    tokens_per_hour=10**12,
    concurrent_requests=10**6,
)
CHARGE = Charge(1300.0, 1000)
KEYS = [uuid.uuid4().hex[:12] for _ in range(100)]


def _percentiles_us(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6

    return {"p50_us": at(0.5), "p99_us": at(0.99), "mean_us": statistics.fmean(ordered) * 1e6}


async def _timed(calls: int, make: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        await make(i)
        samples.append(time.perf_counter() - started)
    return samples


async def measure_store(store: BudgetStore, calls: int) -> dict[str, Any]:
    ids = [uuid.uuid4().hex for _ in range(calls)]
    reserve = await _timed(
        calls, lambda i: store.reserve(KEYS[i % len(KEYS)], LIMITS, CHARGE, ids[i], 600)
    )
    settle = await _timed(
        calls, lambda i: store.settle(KEYS[i % len(KEYS)], LIMITS, ids[i], Charge(900.0, 700))
    )
    in_flight = 64
    gate = asyncio.Semaphore(in_flight)
    concurrent_ids = [uuid.uuid4().hex for _ in range(calls)]

    async def one(i: int) -> None:
        async with gate:
            await store.reserve(KEYS[i % len(KEYS)], LIMITS, CHARGE, concurrent_ids[i], 600)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    per_second = calls / (time.perf_counter() - started)
    for i, reservation in enumerate(concurrent_ids):
        await store.settle(KEYS[i % len(KEYS)], LIMITS, reservation, None)
    return {
        "reserve": _percentiles_us(reserve),
        "settle": _percentiles_us(settle),
        "reserves_per_s_64_in_flight": per_second,
    }


async def _ping(client: Any, calls: int) -> dict[str, float]:
    return _percentiles_us(await _timed(calls, lambda _: client.ping()))


def _table(report: dict[str, Any]) -> str:
    lines = [
        "| store | reserve p50 µs | reserve p99 µs | settle p50 µs | settle p99 µs "
        "| reserves/s (64 in flight) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in report["stores"].items():
        lines.append(
            f"| {name} | {row['reserve']['p50_us']:.0f} | {row['reserve']['p99_us']:.0f} "
            f"| {row['settle']['p50_us']:.0f} | {row['settle']['p99_us']:.0f} "
            f"| {row['reserves_per_s_64_in_flight']:.0f} |"
        )
    ping = report["baseline_redis_ping"]
    lines.append(f"| baseline: Redis PING | {ping['p50_us']:.0f} | {ping['p99_us']:.0f} | | | |")
    return "\n".join(lines)


async def _run(calls: int, redis_port: int) -> dict[str, Any]:
    stores: dict[str, Any] = {}
    memory = InProcessStore()
    stores["in-process"] = await measure_store(memory, calls)
    client = connect(f"redis://127.0.0.1:{redis_port}/0")
    redis_store = RedisStore(client)
    await redis_store.reserve("warm", LIMITS, CHARGE, "warm", 1)  # loads the scripts
    baseline = await _ping(client, calls)
    stores["redis"] = await measure_store(redis_store, calls)
    await redis_store.close()
    return {"stores": stores, "baseline_redis_ping": baseline}


def run(out_dir: Path, calls: int = 5000) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-decisions-"))
    proc, port = start_redis(work)
    try:
        report = asyncio.run(_run(calls, port))
    finally:
        proc.stop()
    report["when"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report["calls"] = calls
    report["cpus"] = os.cpu_count()
    table = _table(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decisions.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "decisions.md").write_text(
        f"# Budget decision cost ({report['when']})\n\n{report['cpus']} CPUs, {calls} calls "
        "per measurement; one at a time for latency, 64 in flight for throughput. Redis: "
        "a local valkey/redis server over loopback, one EVALSHA per decision.\n\n"
        f"{table}\n"
    )
    print(table)
    return report


if __name__ == "__main__":
    run(Path("bench/results"))
