"""`slogate bench decisions`: what one admission's store work costs, per store, in one run.

For the in-process stores and the Redis ones (a real valkey/redis server started here,
one EVALSHA round trip per operation, on a client built as the sidecar builds it: no
per-socket timeouts, the store's own timeout around each call) it measures, one at a time
(p50/p99): a budget reserve and settle, a KV hold and release (this process's ledger
against the fleet's in Redis), and the whole decision's store work as the chain does it
(reserve, then hold) and the whole end's (settle, then release; and both at once); and
reservations per second with 64 in flight. The Redis arms run with redis-py's pure-Python
reply parser and with hiredis's (when installed), interleaved over rounds, medians of the
rounds' percentiles; beside each, the server's own µs per EVALSHA (INFO commandstats). A
bare Redis PING round trip from the same client is the baseline the Redis numbers are read
against. Then every Redis command a request makes through a real Envoy and sidecar
(tooling.benchmarks.round_trips). Target (fleet-wide admission): the whole decision's store
work p99 <= 1 ms on loopback.
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
from tooling.benchmarks import round_trips
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


async def _server_us(client: Any | None) -> float | None:
    """The server's mean µs per EVALSHA since the last reset (None: not asked)."""
    if client is None:
        return None
    stats = await client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))


async def _reset(client: Any | None) -> None:
    if client is not None:
        await client.config_resetstat()


async def measure_store(
    store: BudgetStore, calls: int, client: Any | None = None
) -> dict[str, Any]:
    """`client`: the Redis client under `store`, asked for the server's time per script."""
    ids = [uuid.uuid4().hex for _ in range(calls)]
    await _reset(client)
    cpu_s = time.process_time()
    reserve = await _timed(
        calls, lambda i: store.reserve(KEYS[i % len(KEYS)], LIMITS, CHARGE, ids[i], 600)
    )
    reserve_cpu_us = (time.process_time() - cpu_s) / calls * 1e6
    reserve_server_us = await _server_us(client)
    await _reset(client)
    cpu_s = time.process_time()
    settle = await _timed(
        calls, lambda i: store.settle(KEYS[i % len(KEYS)], LIMITS, ids[i], Charge(900.0, 700))
    )
    settle_cpu_us = (time.process_time() - cpu_s) / calls * 1e6
    settle_server_us = await _server_us(client)
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
        # This process's CPU per call: what a loaded machine's scheduling does not blur.
        "client_cpu_us_per_reserve": reserve_cpu_us,
        "client_cpu_us_per_settle": settle_cpu_us,
        "server_us_per_reserve": reserve_server_us,
        "server_us_per_settle": settle_server_us,
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
    # The end's two round trips are independent: both at once, as a chain settling its
    # steps concurrently would send them (admission.chain settles them one after another).
    overlap_ids = [uuid.uuid4().hex for _ in range(calls)]

    async def decide_again(i: int) -> None:
        await store.reserve(KEYS[i % len(KEYS)], LIMITS, CHARGE, overlap_ids[i], 600)
        await book.hold(HoldAsk(overlap_ids[i], POOL.name, POOL, 4000, 1.0, 600.0))

    async def end_at_once(i: int) -> None:
        await asyncio.gather(
            store.settle(KEYS[i % len(KEYS)], LIMITS, overlap_ids[i], Charge(900.0, 700)),
            book.release(overlap_ids[i]),
        )

    await _timed(calls, decide_again)
    ends_at_once = await _timed(calls, end_at_once)
    return {
        "hold": _percentiles_us(holds),
        "release": _percentiles_us(releases),
        "decision": _percentiles_us(decisions),
        "end": _percentiles_us(ends),
        "end_at_once": _percentiles_us(ends_at_once),
    }


def _admission_table(report: dict[str, Any]) -> str:
    lines = [
        "| ledger | KV hold p50 µs | KV hold p99 µs | release p50 µs | release p99 µs "
        "| whole decision (reserve + hold) p50 µs | p99 µs | whole end (settle + release) "
        "p50 µs | p99 µs | end, both at once p50 µs | p99 µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    parts = ("hold", "release", "decision", "end", "end_at_once")
    for name, row in report["admission"].items():
        cells = [row[part][q] for part in parts for q in ("p50_us", "p99_us")]
        lines.append(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines)


async def _ping(client: Any, calls: int) -> dict[str, float]:
    return _percentiles_us(await _timed(calls, lambda _: client.ping()))


def _table(report: dict[str, Any]) -> str:
    lines = [
        "| store | reserve p50 µs | reserve p99 µs | settle p50 µs | settle p99 µs "
        "| reserves/s (64 in flight) | client CPU µs per reserve | per settle "
        "| server µs per reserve | per settle |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in report["stores"].items():
        server = [
            row.get(k)
            for k in (
                "client_cpu_us_per_reserve",
                "client_cpu_us_per_settle",
                "server_us_per_reserve",
                "server_us_per_settle",
            )
        ]
        lines.append(
            f"| {name} | {row['reserve']['p50_us']:.0f} | {row['reserve']['p99_us']:.0f} "
            f"| {row['settle']['p50_us']:.0f} | {row['settle']['p99_us']:.0f} "
            f"| {row['reserves_per_s_64_in_flight']:.0f} | "
            + " | ".join("" if v is None else f"{v:.0f}" for v in server)
            + " |"
        )
    for name, ping in report["baseline_redis_ping"].items():
        lines.append(
            f"| baseline: Redis PING, {name} | {ping['p50_us']:.0f} | {ping['p99_us']:.0f} "
            "| | | | | | | |"
        )
    return "\n".join(lines)


# The store's timeout around each call, as the sidecar has one (budget.redis_timeout_ms);
# long enough that a loaded machine's stall is measured, not turned into an error.
TIMEOUT_S = 1.0


def parsers() -> dict[str, Any]:
    """redis-py's reply parsers to compare: its own in Python, and hiredis's when installed
    (redis-py picks hiredis by itself when it is)."""
    from redis._parsers import _AsyncRESP3Parser
    from redis.utils import HIREDIS_AVAILABLE

    found: dict[str, Any] = {"pure-Python parser": _AsyncRESP3Parser}
    if HIREDIS_AVAILABLE:
        from redis._parsers import _AsyncHiredisParser

        found["hiredis parser"] = _AsyncHiredisParser
    return found


def _client(redis_port: int, parser: Any) -> Any:
    """A client as the sidecar builds one (extproc.runtime.stores), with `parser`."""
    client = connect(f"redis://127.0.0.1:{redis_port}/0", socket_timeout_s=None)
    client.connection_pool.connection_kwargs["parser_class"] = parser
    return client


def _median_row(rows: list[Any]) -> Any:
    """Each number the median over the rounds' (the same shape as one round's)."""
    first = rows[0]
    if isinstance(first, dict):
        return {k: _median_row([r[k] for r in rows]) for k in first}
    if first is None:
        return None
    return statistics.median(rows)


async def _run(calls: int, redis_port: int, rounds: int) -> dict[str, Any]:
    stores: dict[str, Any] = {"in-process": await measure_store(InProcessStore(), calls)}
    admission: dict[str, Any] = {
        "in-process (budgets and KV in this process)": await measure_admission(
            InProcessStore(), LocalBook(time.monotonic), calls
        )
    }
    arms: dict[str, list[dict[str, Any]]] = {name: [] for name in parsers()}
    per_round = max(100, calls // rounds)
    for _ in range(rounds):
        for name, parser in parsers().items():
            client = _client(redis_port, parser)
            redis_store = RedisStore(client, timeout_s=TIMEOUT_S)
            await redis_store.reserve("warm", LIMITS, CHARGE, "warm", 1)  # loads the scripts
            book = RedisBook(client, timeout_s=TIMEOUT_S)
            await book.hold(HoldAsk("warm", POOL.name, POOL, 1, 1.0, 1.0))  # loads them
            await book.release("warm")
            arms[name].append(
                {
                    "ping": await _ping(client, per_round),
                    "store": await measure_store(redis_store, per_round, client),
                    "admission": await measure_admission(redis_store, book, per_round),
                }
            )
            await redis_store.close()
    baseline = {}
    for name, rows in arms.items():
        median = _median_row(rows)
        baseline[name] = median["ping"]
        stores[f"redis, {name}"] = median["store"]
        admission[f"redis, {name} (budgets and the fleet's KV ledger)"] = median["admission"]
    return {"stores": stores, "baseline_redis_ping": baseline, "admission": admission}


def run(
    out_dir: Path, calls: int = 6000, rounds: int = 3, census_requests: int = 100
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="slogate-bench-decisions-"))
    proc, port = start_redis(work)
    try:
        report = asyncio.run(_run(calls, port, rounds))
    finally:
        proc.stop()
    report["round_trips"] = round_trips.census(work, census_requests)
    report["when"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report["calls"] = calls
    report["rounds"] = rounds
    report["cpus"] = os.cpu_count()
    table = _table(report) + "\n\n" + _admission_table(report)
    census = round_trips.table(report["round_trips"])
    write_report(
        out_dir,
        "decisions",
        report,
        f"# Admission store cost ({report['when']})\n\n{report['cpus']} CPUs, {calls} calls "
        f"per measurement over {rounds} interleaved rounds (medians of the rounds' "
        "percentiles); one at a time for latency, 64 in flight for throughput. Redis: a "
        "local valkey/redis server over loopback, one EVALSHA per operation, the client "
        "built as the sidecar builds it; 'server µs': the server's own time per EVALSHA "
        "(INFO commandstats); 'client CPU': this process's CPU per call, which the other "
        "processes on a shared machine do not blur as they do the percentiles. The second "
        "table is the KV ledger, and the whole decision's store work as the chain does it "
        "(budget reserve, then KV hold: two round trips, since a budget's keys and a "
        "pool's sit in different Redis Cluster slots). Target: "
        f"the whole decision p99 <= 1 ms.\n\n{table}\n\n"
        f"## Every Redis round trip of a request\n\n{census_requests} chat requests one at "
        "a time through a real Envoy and `slogate serve` on the Redis store, from a tenant "
        "with day and month spend budgets (MONITOR: "
        "what clients sent; the commands a script runs inside the server are not round "
        f"trips).\n\n{census}\n",
        indent=2,
    )
    print(table)
    print(census)
    return report


if __name__ == "__main__":
    run(Path("bench/results"))
