"""Several real sidecar processes sharing one real Redis: exact budgets, and Redis outages.

The sidecars are driven over gRPC exactly as Envoy drives them (tooling.benchmarks.driver),
so hundreds of requests can be in flight at once on a two-core machine. The local share's
arithmetic: tests/budget/test_failover.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml

from budget.redis_store import RedisStore, connect
from extproc.runtime.processes import ManagedProcess
from policy.domain import hash_api_key
from tests.support.http import metric, scrape
from tooling.benchmarks.driver import SidecarDriver
from tooling.stack import processes
from tooling.stack.redis import start_redis

TOKENS_PER_MINUTE = 20_000


KEY = "sk-hammer"


def write_policy(path: Path, redis_port: int, replicas: int, timeout_ms: float = 10) -> Path:
    policy = {
        "budget": {
            "store": "redis",
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "redis_timeout_ms": timeout_ms,
            "replicas": replicas,
        },
        "keys": [
            {
                "key": KEY,
                "tenant": "hammer",
                "tier": "standard",
                "limits": {"tokens_per_minute": TOKENS_PER_MINUTE, "concurrent_requests": 10_000},
            },
            {"key": "sk-warm-up", "tenant": "warm-up", "tier": "standard"},
        ],
    }
    path.write_text(yaml.safe_dump(policy))
    return path


def start_sidecar(work: Path, name: str, policy: Path) -> tuple[ManagedProcess, int, int]:
    proc, ports = processes.start_sidecar(work, policy, name)
    return proc, ports.grpc, ports.metrics


def body(max_tokens: int = 100) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens}


async def hammer(
    drivers: list[SidecarDriver], requests: int, in_flight: int
) -> list[tuple[int, object]]:
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> tuple[int, object]:
        async with gate:
            return i % len(drivers), await drivers[i % len(drivers)].decide(KEY, body())

    return await asyncio.gather(*(one(i) for i in range(requests)))


def test_replicas_share_one_budget_exactly(tmp_path: Path, processes: list[ManagedProcess]) -> None:
    redis_proc, redis_port = start_redis(tmp_path)
    processes.append(redis_proc)
    # A generous timeout: this test is about exactness while Redis answers, so no decision
    # may fall back to local shares because 200 requests queue in one event loop.
    policy = write_policy(tmp_path / "policy.yaml", redis_port, replicas=2, timeout_ms=2000)
    sidecars = [start_sidecar(tmp_path, f"sidecar{i}", policy) for i in range(2)]
    processes.extend(proc for proc, _, _ in sidecars)

    async def scenario() -> None:
        drivers = [SidecarDriver(f"127.0.0.1:{port}") for _, port, _ in sidecars]
        # Warm both replicas (connections, scripts loaded) on another key, so that both
        # take part in the race for the hammered key from its first request.
        for driver in drivers:
            assert (await driver.decide("sk-warm-up", body())).status == 200
        started = time.monotonic()
        results = await hammer(drivers, requests=400, in_flight=200)
        elapsed_s = time.monotonic() - started
        admitted = [(d, r) for d, r in results if r.status == 200]  # type: ignore[attr-defined]
        refused = [r for _, r in results if r.status == 429]  # type: ignore[attr-defined]
        assert len(admitted) + len(refused) == 400  # nothing else: no 500, no timeout
        # Bucket 0-4k has weight 1.0, so the weighted charge is the context estimate.
        charged = sum(int(r.headers["x-slogate-est-tokens"]) for _, r in admitted)
        per_request = int(admitted[0][1].headers["x-slogate-est-tokens"])
        # The bound: the bucket's capacity plus what it refilled while the test ran.
        assert charged <= TOKENS_PER_MINUTE + TOKENS_PER_MINUTE / 60 * elapsed_s
        assert charged >= TOKENS_PER_MINUTE - per_request  # and nothing was under-admitted
        assert {d for d, _ in admitted} == {0, 1}  # both replicas admitted some
        for _, _, metrics_port in sidecars:
            samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
            assert metric(samples, "slogate_budget_store_decisions_total", store="local") == 0

        client = connect(f"redis://127.0.0.1:{redis_port}/0")
        store = RedisStore(client)
        key_id = hash_api_key(KEY)[:12]
        state = await client.hgetall(f"slogate:{{{key_id}}}:state")
        assert float(state[b"tokens"]) >= 0.0  # never a negative balance
        assert await store.outstanding(key_id) == len(admitted)

        # Settle everything through each sidecar's access log: nothing stays outstanding.
        for index, driver in enumerate(drivers):
            mine = [r.outcome(200, 5, 10) for d, r in admitted if d == index]  # type: ignore[attr-defined]
            await driver.report(mine)
        deadline = time.monotonic() + 10
        while await store.outstanding(key_id) and time.monotonic() < deadline:  # noqa: ASYNC110 - polls another process
            await asyncio.sleep(0.05)
        assert await store.outstanding(key_id) == 0
        usage = await store.usage(key_id)
        assert usage[60] == 15 * len(admitted)  # settled with the real usage
        await store.close()
        for driver in drivers:
            await driver.close()

    asyncio.run(scenario())


def test_redis_outage_degrades_to_local_shares_and_recovers(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis_proc, redis_port = start_redis(tmp_path, "redis-a")
    # Down is down (connection refused at once); the timeout only has to ride out a loaded
    # two-core machine, so that decisions after recovery reliably go to Redis.
    policy = write_policy(tmp_path / "policy.yaml", redis_port, replicas=1, timeout_ms=250)
    sidecar, grpc_port, metrics_port = start_sidecar(tmp_path, "sidecar", policy)
    processes.append(sidecar)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    async def scenario() -> None:
        driver = SidecarDriver(f"127.0.0.1:{grpc_port}")

        async def burst(count: int) -> list[tuple[float, object]]:
            async def timed() -> tuple[float, object]:
                started = time.monotonic()
                reply = await driver.decide(KEY, body(max_tokens=50))
                return time.monotonic() - started, reply

            return await asyncio.gather(*(timed() for _ in range(count)))

        healthy = await burst(20)
        assert all(r.status == 200 for _, r in healthy)  # type: ignore[attr-defined]
        assert metric(scrape(metrics_url), "slogate_redis_up") == 1
        # Three more replicas' heartbeats: the local share is a quarter because the live
        # count says 4 (the policy's `replicas` is only the fallback).
        client = connect(f"redis://127.0.0.1:{redis_port}/0")
        seconds, _ = await client.time()
        await client.zadd("slogate:{fleet}:replicas", {f"other{i}": seconds for i in range(3)})
        await client.aclose()
        deadline = time.monotonic() + 10
        while metric(scrape(metrics_url), "slogate_fleet_replicas") != 4:
            assert time.monotonic() < deadline, "the sidecar never counted the heartbeats"
            await asyncio.sleep(0.2)

        redis_proc.stop()
        down = await burst(120)
        # Every decision still came back, well inside Envoy's 1 s message timeout.
        assert max(t for t, _ in down) < 1.0
        statuses = {r.status for _, r in down}  # type: ignore[attr-defined]
        assert statuses <= {200, 429} and 200 in statuses
        # Local share: 20,000 / 4 live replicas; 120 x ~56 tokens is more than that.
        assert 429 in statuses
        samples = scrape(metrics_url)
        assert metric(samples, "slogate_redis_up") == 0
        assert metric(samples, "slogate_budget_store_decisions_total", store="local") >= 120
        admitted_locally = [r for _, r in down if r.status == 200]  # type: ignore[attr-defined]

        restarted, _ = start_redis(tmp_path, "redis-b", port=redis_port)
        processes.append(restarted)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            await burst(1)
            if metric(scrape(metrics_url), "slogate_redis_up") == 1:
                break
            await asyncio.sleep(0.2)
        assert metric(scrape(metrics_url), "slogate_redis_up") == 1
        before = metric(scrape(metrics_url), "slogate_budget_store_decisions_total", store="shared")
        after_recovery = await burst(10)
        assert all(r.status == 200 for _, r in after_recovery)  # type: ignore[attr-defined]
        assert (
            metric(scrape(metrics_url), "slogate_budget_store_decisions_total", store="shared")
            == before + 10
        )
        # Reservations made during the outage settle locally, without errors.
        await driver.report([r.outcome(200, 5, 5) for r in admitted_locally])  # type: ignore[attr-defined]
        await driver.close()

    asyncio.run(scenario())
