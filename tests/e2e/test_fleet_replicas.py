"""Several real sidecar processes sharing one real Redis: one KV ledger for the fleet.

The sidecars are driven over gRPC as Envoy drives them (tooling.benchmarks.driver), so
hundreds of requests can be in flight on a two-core machine; the ledger is read straight
from Redis. Each test starts its own Redis and sidecars.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from budget.redis_store import connect
from extproc.runtime.processes import ManagedProcess
from policy.schema import BudgetStoreKind
from tests.support.http import CHAT, Reply, chat_body, metric, post, scrape
from tests.support.proxy import CuttableProxy
from tests.support.stack import example_policy, start_stack
from tests.support.stack import write_policy as write_stack_policy
from tooling.benchmarks.driver import DriverReply, SidecarDriver
from tooling.stack.processes import start_sidecar
from tooling.stack.redis import start_redis

CAPACITY = 10_000  # the pool's KV cache, in tokens
KEY = "sk-fleet"
UPSTREAM_TIMEOUT_S = 2.0  # a hold lives 2 s + a 5 s slack: a dead replica's frees in 7 s
TOTALS = "slogate:kv:{default}:totals"


def write_policy(
    path: Path,
    redis_port: int,
    waiting_room: bool = False,
    redis_timeout_ms: int = 1000,
    upstream_timeout_s: float = UPSTREAM_TIMEOUT_S,
) -> Path:
    policy = {
        "budget": {
            "store": "redis",
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "redis_timeout_ms": redis_timeout_ms,
            "replicas": 3,
        },
        "request": {"upstream_timeout_s": upstream_timeout_s},
        # One bucket, KV weight 1: a request's footprint is its context, prompt + max_tokens.
        "buckets": [{"name": "all", "cost_weight": 1.0, "kv_weight": 1.0}],
        "pools": {"default": {"endpoints": ["127.0.0.1:9"], "kv_capacity_tokens": CAPACITY}},
        # Nothing listens on the discard port: the sidecars are driven directly, and their
        # probes would take the pool's only engine out.
        "engines": {"health": {"probes": False}},
        "breaker": {"scrape_metrics": False},
        "waiting_room": {"enabled": waiting_room},
        "keys": [
            {
                "key": KEY,
                "tenant": "fleet",
                "tier": "critical",
                "limits": {"concurrent_requests": 100_000},
            }
        ],
    }
    path.write_text(yaml.safe_dump(policy))
    return path


class Fleet:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.redis, self.redis_port = start_redis(work)
        self.procs: list[ManagedProcess] = [self.redis]
        self.sidecars: list[tuple[ManagedProcess, int, int]] = []
        self.policy = write_policy(work / "policy.yaml", self.redis_port)

    def use_policy(self, **options: Any) -> None:
        """Other policy settings (write_policy's), before any sidecar starts."""
        self.policy = write_policy(self.work / "policy.yaml", self.redis_port, **options)

    def start(self, count: int, env: dict[int, dict[str, str]] | None = None) -> None:
        for i in range(count):
            proc, ports = start_sidecar(
                self.work, self.policy, f"sidecar{i}", env=(env or {}).get(i)
            )
            self.procs.append(proc)
            self.sidecars.append((proc, ports.grpc, ports.metrics))

    def drivers(self) -> list[SidecarDriver]:
        return [SidecarDriver(f"127.0.0.1:{port}") for _, port, _ in self.sidecars]

    def metrics(self, index: int) -> dict[Any, float]:
        return scrape(f"http://127.0.0.1:{self.sidecars[index][2]}/metrics")

    async def totals(self) -> dict[str, int]:
        client = connect(f"redis://127.0.0.1:{self.redis_port}/0")
        raw = await client.hgetall(TOTALS)
        await client.aclose()
        return {k.decode(): int(float(v)) for k, v in raw.items() if k != b"ratio"}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(tmp_path)
    yield made
    made.stop()


def body(max_tokens: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


def footprint(reply: DriverReply) -> int:
    return int(reply.headers["x-slogate-est-tokens"])


async def settle(driver: SidecarDriver, replies: list[DriverReply]) -> None:
    await driver.report([r.outcome(200, 5, 5) for r in replies if r.tracking_id])


async def eventually(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.1)


def test_three_replicas_under_load_never_admit_past_the_pool(fleet: Fleet) -> None:
    """300 requests, 150 in flight, spread over 3 replicas: the admitted footprints never
    exceed the pool's capacity (exactly: each hold is one atomic script), checked from the
    replies and from Redis; several replicas admitted some; after the ends, nothing is held."""
    # Exactness is while Redis answers: a timeout generous enough for 150 requests in flight
    # on a loaded two-core machine (a slower answer is a local decision, on a local share),
    # and holds that outlive the race (with a 2 s upstream timeout they expire after 7 s).
    fleet.use_policy(redis_timeout_ms=3000, upstream_timeout_s=600.0)
    fleet.start(3)

    async def scenario() -> None:
        drivers = fleet.drivers()
        for driver in drivers:  # connections and scripts loaded before the race
            warm = await driver.decide(KEY, body(10))
            await settle(driver, [warm])
        await eventually(lambda: _zero(fleet))

        async def counted() -> bool:  # every replica's heartbeat seen by every replica
            return all(metric(fleet.metrics(i), "slogate_fleet_replicas") == 3 for i in range(3))

        await eventually(counted)
        gate = asyncio.Semaphore(150)

        async def one(i: int) -> tuple[int, DriverReply]:
            async with gate:
                return i % 3, await drivers[i % 3].decide(KEY, body(50 + (i % 7) * 20))

        results = await asyncio.gather(*(one(i) for i in range(300)))
        for index in range(3):  # every decision on the shared ledger, none on a local share
            samples = fleet.metrics(index)
            assert metric(samples, "slogate_kv_ledger_decisions_total", store="local") == 0
        admitted = [(d, r) for d, r in results if r.status == 200]
        refused = [r for _, r in results if r.status != 200]
        assert {r.status for r in refused} <= {503}
        assert {r.headers["x-slogate-reason"] for r in refused} == {"kv_cache_full"}
        held = sum(footprint(r) for _, r in admitted)
        assert held <= CAPACITY
        assert held >= CAPACITY - 200  # and the pool was filled, not starved
        # Replicas admitted from one pool at once (under load, the slowest may find it full
        # before its first decision: at least two, not all three).
        assert len({d for d, _ in admitted}) >= 2
        assert (await fleet.totals())["tokens"] == held
        for index, driver in enumerate(drivers):
            await settle(driver, [r for d, r in admitted if d == index])
        await eventually(lambda: _zero(fleet))
        for driver in drivers:
            await driver.close()

    asyncio.run(scenario())


async def _zero(fleet: Fleet) -> bool:
    totals = await fleet.totals()
    return totals.get("tokens", 0) == 0 and totals.get("sequences", 0) == 0


def test_a_request_needing_most_of_the_pool_fits_through_any_replica(fleet: Fleet) -> None:
    """60% of an empty pool: admitted through each replica in turn (with a ledger each,
    every replica's part is a third, and it would be refused everywhere)."""
    fleet.start(3)

    async def scenario() -> None:
        drivers = fleet.drivers()
        for driver in drivers:
            big = await driver.decide(KEY, body(int(CAPACITY * 0.6)))
            assert big.status == 200, big.body
            second = await drivers[(drivers.index(driver) + 1) % 3].decide(
                KEY, body(int(CAPACITY * 0.6))
            )
            assert second.headers.get("x-slogate-reason") == "kv_cache_full"  # pool full
            await settle(driver, [big])
            await eventually(lambda: _zero(fleet))
        for driver in drivers:
            await driver.close()

    asyncio.run(scenario())


def test_a_replica_killed_while_holding_frees_its_holds_at_their_deadline(fleet: Fleet) -> None:
    fleet.start(2)

    async def scenario() -> None:
        first, second = fleet.drivers()
        held = await first.decide(KEY, body(int(CAPACITY * 0.7)))
        assert held.status == 200
        killed_at = time.monotonic()
        os.kill(fleet.sidecars[0][0].pid or 0, signal.SIGKILL)
        refused = await second.decide(KEY, body(int(CAPACITY * 0.7)))
        assert refused.status == 503  # the dead replica's hold still counts ...
        ttl_s = UPSTREAM_TIMEOUT_S + 5.0
        while (reply := await second.decide(KEY, body(int(CAPACITY * 0.7)))).status != 200:
            assert time.monotonic() - killed_at < ttl_s + 2.0, "the hold never expired"
            await asyncio.sleep(0.25)
        freed_after_s = time.monotonic() - killed_at
        assert freed_after_s >= ttl_s - 1.0  # ... until its deadline, not before
        await settle(second, [reply])
        await eventually(lambda: _zero(fleet))
        await first.close()
        await second.close()

    asyncio.run(scenario())


def test_redis_killed_and_restarted_under_load(fleet: Fleet) -> None:
    """Local shares while Redis is away (no crash, every decision inside the message
    timeout), shared again after, and no count below zero."""
    fleet.use_policy(redis_timeout_ms=250)  # a stalled Redis must not hold a decision long
    fleet.start(2)

    async def scenario() -> None:
        drivers = fleet.drivers()
        stop = asyncio.Event()
        replies: list[tuple[float, int, DriverReply]] = []

        async def load(index: int) -> None:
            while not stop.is_set():
                started = time.monotonic()
                reply = await drivers[index].decide(KEY, body(300))
                replies.append((time.monotonic() - started, index, reply))
                if reply.status == 200:
                    await settle(drivers[index], [reply])
                await asyncio.sleep(0.02)

        tasks = [asyncio.create_task(load(i)) for i in (0, 1, 0, 1)]
        await asyncio.sleep(1.0)
        fleet.redis.stop()
        await asyncio.sleep(1.5)
        during = [m for m in (fleet.metrics(0), fleet.metrics(1))]
        restarted, _ = start_redis(fleet.work, "redis-b", port=fleet.redis_port)
        fleet.procs.append(restarted)
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*tasks)
        assert all(proc.running() for proc, _, _ in fleet.sidecars)
        assert max(t for t, _, _ in replies) < 1.0  # nothing hung past the message timeout
        assert {r.status for _, _, r in replies} <= {200, 503}
        for samples in during:
            assert metric(samples, "slogate_kv_ledger_shared") == 0
            assert metric(samples, "slogate_kv_ledger_decisions_total", store="local") > 0
        for index in (0, 1):
            after = await drivers[index].decide(KEY, body(10))  # a decision after the restart
            await settle(drivers[index], [after])
            samples = fleet.metrics(index)
            assert metric(samples, "slogate_kv_ledger_shared") == 1
        await eventually(lambda: _zero(fleet))
        totals = await fleet.totals()
        assert min(totals.values(), default=0) >= 0
        for index in (0, 1):
            assert metric(fleet.metrics(index), "slogate_kv_in_flight_tokens", pool="default") == 0
        for driver in drivers:
            await driver.close()

    asyncio.run(scenario())


def test_one_replica_cut_off_from_redis_degrades_alone(fleet: Fleet) -> None:
    with CuttableProxy(fleet.redis_port) as proxy:
        fleet.start(2, env={1: {"SLOGATE_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}})

        async def scenario() -> None:
            whole, cut = fleet.drivers()
            for driver in (whole, cut):
                reply = await driver.decide(KEY, body(10))
                assert reply.status == 200
                await settle(driver, [reply])
            proxy.cut()
            replies = [await cut.decide(KEY, body(10)) for _ in range(5)]
            assert all(r.status == 200 for r in replies)  # decided on its local share
            await settle(cut, replies)
            other = await whole.decide(KEY, body(10))
            await settle(whole, [other])
            assert metric(fleet.metrics(1), "slogate_kv_ledger_shared") == 0
            assert metric(fleet.metrics(0), "slogate_kv_ledger_shared") == 1
            assert metric(fleet.metrics(0), "slogate_kv_ledger_decisions_total", store="local") == 0
            # Its local share is half the pool (2 live replicas when it was cut off).
            half = await cut.decide(KEY, body(int(CAPACITY * 0.6)))
            assert half.status == 503
            proxy.heal()
            await asyncio.sleep(1.2)  # its retry interval
            back = await cut.decide(KEY, body(int(CAPACITY * 0.6)))
            assert back.status == 200
            assert metric(fleet.metrics(1), "slogate_kv_ledger_shared") == 1
            await settle(cut, [back])
            await eventually(lambda: _zero(fleet))
            await whole.close()
            await cut.close()

        asyncio.run(scenario())


# -- the local stack with N replicas (slogate up --replicas N --budget-store redis) ------


def _stack_policy(tmp: Path) -> Path:
    raw = example_policy()
    raw["pools"]["default"]["kv_capacity_tokens"] = 5000  # a 3000-token context is 60%
    # ... of one engine: a request must fit the engine it runs on.
    raw["pools"]["default"]["endpoints"] = raw["pools"]["default"]["endpoints"][:1]
    return write_stack_policy(tmp / "fleet-policy.yaml", raw)


def _big(url: str) -> Reply:
    return post(url, CHAT, chat_body("hello", max_tokens=3000), key="sk-demo-critical")


def test_the_local_stack_runs_replicas_on_consecutive_ports_sharing_redis(tmp_path: Path) -> None:
    stack = start_stack(
        tmp_path, _stack_policy(tmp_path), replicas=2, budget_store=BudgetStoreKind.REDIS
    )
    try:
        assert stack.redis is not None and len(stack.fleet) == 2
        for replica in stack.fleet:
            reply = _big(replica.url)  # 60% of the pool, through either replica
            assert reply.status == 200, reply.body
        for replica in stack.fleet:
            samples = scrape(replica.metrics_url)
            assert metric(samples, "slogate_kv_ledger_decisions_total", store="shared") >= 1
        line = stack.ready_line()
        assert all(str(r.listen_port) in line and str(r.grpc_port) in line for r in stack.fleet)
        assert f"redis://127.0.0.1:{stack.redis_port}" in line
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_replicas_with_a_ledger_each_refuse_what_the_pool_could_hold(tmp_path: Path) -> None:
    """What the shared ledger fixes: with the in-process store, each of 2 replicas admits
    against half the pool, and a 60% request is refused through both."""
    stack = start_stack(tmp_path, _stack_policy(tmp_path), replicas=2)
    try:
        for replica in stack.fleet:
            reply = _big(replica.url)
            assert reply.status == 503 and reply.headers["x-slogate-reason"] == "kv_cache_full"
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()
