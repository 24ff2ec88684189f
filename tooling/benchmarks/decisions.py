"""`slogate bench decisions`: what one admission's store work costs, per store, in one run.

For the in-process stores and the Redis ones (a real valkey/redis server started here,
one EVALSHA round trip per operation) it measures, one at a time (p50/p99): a budget
reserve and settle, a KV hold and release (this process's ledger against the fleet's in
Redis), and the whole decision's store work as the chain does it (reserve, then hold) and
the whole end's (settle, then release); and reservations per second with 64 in flight. A
bare Redis PING round trip from the same client is the baseline the Redis numbers are read
against. Target (fleet-wide admission): the whole decision's store work p99 <= 1 ms on
loopback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from admission.kv.book import HoldAsk, KvBook, LocalBook
from admission.kv.redis_ledger import RedisBook
from budget.ledger import Charge
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore, InProcessStore
from policy.domain import Limits, Pool
from policy.quantiles import quantile
from tooling.benchmarks.reports import write_report
from tooling.stack.redis import start_redis

LIMITS = Limits(
    requests_per_minute=10**9,
    tokens_per_minute=10**12,
    tokens_per_hour=10**12,
    concurrent_requests=10**6,
)
CHARGE = Charge(1300.0, 1000)
KEYS = [uuid.uuid4().hex[:12] for _ in range(100)]


def _percentiles_us(samples_s: list[float]) -> dict[str, float]:
    return {
        "p50_us": quantile(samples_s, 0.5) * 1e6,
        "p99_us": quantile(samples_s, 0.99) * 1e6,
        "mean_us": statistics.fmean(samples_s) * 1e6,
    }


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


# A pool that never fills: the benchmark measures the round trip, not refusals.
POOL = Pool(name="bench", endpoints=(), kv_capacity_tokens=10**12, max_num_seqs=10**9)


async def measure_admission(store: BudgetStore, book: KvBook, calls: int) -> dict[str, Any]:
    """KV hold / release alone, then the whole decision (reserve + hold) and the whole end
    (settle + release), one request at a time."""
    ids = [uuid.uuid4().hex for _ in range(calls)]

    async def hold(i: int) -> str:
        return await book.hold(HoldAsk(ids[i], POOL.name, POOL, 4000, 1.0, 600.0))

    holds = await _timed(calls, hold)
    releases = await _timed(calls, lambda i: book.release(ids[i]))
    decision_ids = [uuid.uuid4().hex for _ in range(calls)]

    async def decide(i: int) -> None:
        await store.reserve(KEYS[i % len(KEYS)], LIMITS, CHARGE, decision_ids[i], 600)
        await book.hold(HoldAsk(decision_ids[i], POOL.name, POOL, 4000, 1.0, 600.0))

    async def end(i: int) -> None:
        await store.settle(KEYS[i % len(KEYS)], LIMITS, decision_ids[i], Charge(900.0, 700))
        await book.release(decision_ids[i])

    decisions = await _timed(calls, decide)
    ends = await _timed(calls, end)
    return {
        "hold": _percentiles_us(holds),
        "release": _percentiles_us(releases),
        "decision": _percentiles_us(decisions),
        "end": _percentiles_us(ends),
    }


def _admission_table(report: dict[str, Any]) -> str:
    lines = [
        "| ledger | KV hold p50 µs | KV hold p99 µs | release p50 µs | release p99 µs "
        "| whole decision (reserve + hold) p50 µs | p99 µs | whole end (settle + release) "
        "p50 µs | p99 µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in report["admission"].items():
        cells = [
            row[part][q]
            for part in ("hold", "release", "decision", "end")
            for q in ("p50_us", "p99_us")
        ]
        lines.append(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines)


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
    book = RedisBook(client)
    await book.hold(HoldAsk("warm", POOL.name, POOL, 1, 1.0, 1.0))  # loads the scripts
    await book.release("warm")
    admission = {
        "in-process (budgets and KV in this process)": await measure_admission(
            InProcessStore(), LocalBook(time.monotonic), calls
        ),
        "redis (budgets and the fleet's KV ledger)": await measure_admission(
            redis_store, book, calls
        ),
    }
    await redis_store.close()
    return {"stores": stores, "baseline_redis_ping": baseline, "admission": admission}


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
    table = _table(report) + "\n\n" + _admission_table(report)
    write_report(
        out_dir,
        "decisions",
        report,
        f"# Admission store cost ({report['when']})\n\n{report['cpus']} CPUs, {calls} calls "
        "per measurement; one at a time for latency, 64 in flight for throughput. Redis: "
        "a local valkey/redis server over loopback, one EVALSHA per operation. The second "
        "table is the KV ledger, and the whole decision's store work as the chain does it "
        "(budget reserve, then KV hold: two round trips, since a budget's keys and a pool's "
        "sit in different Redis Cluster slots). Target: the whole decision p99 <= 1 ms.\n\n"
        f"{table}\n",
        indent=2,
    )
    print(table)
    return report


if __name__ == "__main__":
    run(Path("bench/results"))
