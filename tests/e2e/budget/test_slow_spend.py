"""Spend budgets under a slow Redis: a sidecar in this process, driven over real gRPC as
Envoy drives it, on a real Redis-compatible server of the test's own that it pauses
(SIGSTOP, then SIGCONT) or answers late through a proxy.

- paused, `spend_unverified: refuse`: a clear 503 `spend_unverified`; the token budget's
  reservation is given back, and the spend reservation that lands once Redis resumes is
  refunded: nothing is held afterwards.
- paused, `admit` (the default): admitted; what it spent is counted once Redis answers,
  exactly once.
- slowed between the two timeouts: the token budget falls back to its local share, the spend
  check waits and decides on the real month (a full tenant refused, another admitted).

No assertion is timed: the pauses last until the test ends them, the delay sits far from
both timeouts, and every wait for the sidecar's retries is for a condition.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from admission.spend_step import SpendStep
from budget.redis_store import connect
from budget.spend import SpendHold, windows
from budget.spend_redis import RedisSpendStore
from extproc.request.contract import REASON_HEADER
from extproc.runtime.processes import ManagedProcess
from extproc.runtime.sidecar import Sidecar
from policy.domain import hash_api_key
from tests.support.in_process import in_process
from tests.support.proxy import CuttableProxy
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import SidecarDriver
from tooling.stack.redis import start_redis

WIDE_OPEN = {"requests_per_minute": 10_000, "tokens_per_minute": 10**9, "tokens_per_hour": 10**9}
DAY = 100_000.0  # token-equivalents (the default prices: 1 a token of any kind)


def policy(tmp: Path, redis_port: int, **budget: Any) -> Path:
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False  # no pools run here
    raw["budget"] = {
        "store": "redis",
        "redis_url": f"redis://127.0.0.1:{redis_port}/0",
        **budget,
    }
    raw["tenants"] = {
        "defaults": {},
        "list": {
            "payg": {"limits": WIDE_OPEN, "spend": {"per_day": DAY}},
            "full": {"limits": WIDE_OPEN, "spend": {"per_day": 100}},
            "warm": {"limits": WIDE_OPEN, "spend": {"per_day": DAY}},
        },
    }
    raw["keys"] += [
        {"key": f"sk-{tenant}", "tenant": tenant} for tenant in ("payg", "full", "warm")
    ]
    raw["decision_log"] = {"dir": str(tmp / "decisions"), "sample_rate": 1.0}
    return write_policy(tmp / "policy.yaml", raw)


def chat(max_tokens: int = 50) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens}


def sample(sidecar: Sidecar, name: str, **labels: str) -> float:
    """A metric's sample with these labels, or the sum of all its samples without any."""
    if labels:
        return sidecar.metrics.registry.get_sample_value(name, labels) or 0.0
    return sum(
        s.value for m in sidecar.metrics.registry.collect() for s in m.samples if s.name == name
    )


def spend_step(sidecar: Sidecar) -> SpendStep:
    step = sidecar.path.admission.spend
    assert step is not None
    return step


async def backlog_empty(sidecar: Sidecar) -> bool:
    """No settlement waits for Redis any more (read from the step, not from the gauge,
    which the next retry sets)."""
    return len(spend_step(sidecar).backlog) == 0


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Until `check()` holds: the sidecar retries each second, on a machine however loaded."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.1)


async def spent_today(redis_port: int, tenant: str) -> float:
    """Spent plus held in the tenant's day, read from Redis itself."""
    client = connect(f"redis://127.0.0.1:{redis_port}/0")
    (day,) = windows({"day": DAY}, time.time())
    try:
        return (await RedisSpendStore(client).used(tenant, [day.id]))[day.id]
    finally:
        await client.aclose()


def decisions(tmp: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for log in (tmp / "decisions").glob("decisions-*.jsonl")
        for line in log.read_text().splitlines()
    ]


async def warmed(driver: SidecarDriver) -> None:
    """Requests at once, of another tenant with a spend budget: the scripts loaded and
    several connections open, so that a check made while Redis is paused sends its command
    on one (it lands when Redis resumes) rather than waiting on a new connection's
    handshake (it never would)."""
    replies = await asyncio.gather(*(driver.decide("sk-warm", chat()) for _ in range(8)))
    await driver.report([r.outcome(200, 1, 1) for r in replies if r.tracking_id])


def paused(redis: ManagedProcess) -> None:
    redis.signal(signal.SIGSTOP)  # only the server this test started


def resumed(redis: ManagedProcess) -> None:
    redis.signal(signal.SIGCONT)


async def test_paused_redis_refused_with_a_clear_error_and_nothing_held(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis, port = start_redis(tmp_path)
    processes.append(redis)
    path = policy(tmp_path, port, spend_timeout_ms=200, spend_unverified="refuse")
    async with in_process(path, exact_tokenizer=False) as (sidecar, driver, _):
        budget_id = sidecar.policy().keys[hash_api_key("sk-payg")].budget_id
        await warmed(driver)
        paused(redis)
        try:
            refused = await driver.decide("sk-payg", chat())
            # The token budget (decided on its local share while Redis is away) gave back
            # its reservation, and KV admission never held anything: nothing leaked here.
            assert await sidecar.stores.budgets.outstanding(budget_id) == 0
            in_flight = sample(sidecar, "slogate_kv_in_flight_tokens", pool="default")
        finally:
            resumed(redis)
        assert refused.status == 503
        assert refused.headers[REASON_HEADER] == "spend_unverified"
        assert refused.headers["retry-after"] == "1"
        error = json.loads(refused.body)["error"]
        assert (error["type"], error["code"]) == ("server_error", "spend_unverified")
        assert "could not be checked in time" in error["message"]
        assert in_flight == 0
        unverified = {"tenant": "payg", "action": "refused", "cause": "timeout"}
        assert sample(sidecar, "slogate_tenant_spend_unverified_total", **unverified) == 1

        # Redis answers again: the reservation sent while it was paused (it landed: the
        # connection it went on was open) is refunded from the backlog.
        await eventually(lambda: backlog_empty(sidecar))
        assert sample(sidecar, "slogate_spend_settlements_retried_total", result="settled") >= 1
        assert await spent_today(port, "payg") == 0
        # The next requests are checked as usual. Once one is decided in Redis again, the
        # token budget refunds there what a reservation sent while it was paused holds
        # (budget.failover): nothing stays held anywhere once they end.
        admitted = 0

        async def budgets_shared_again() -> bool:
            nonlocal admitted
            before = sample(sidecar, "slogate_budget_store_decisions_total", store="shared")
            again = await driver.decide("sk-payg", chat())
            assert again.status == 200 and again.tracking_id is not None
            await driver.report([again.outcome(200, 10, 20)])
            admitted += 1
            return sample(sidecar, "slogate_budget_store_decisions_total", store="shared") > before

        await eventually(budgets_shared_again)

        async def nothing_held() -> bool:
            return await sidecar.stores.budgets.outstanding(budget_id) == 0

        await eventually(nothing_held)
        assert await spent_today(port, "payg") == 30 * admitted
    assert [d["reason"] for d in decisions(tmp_path) if d["decision"] == "refused"] == [
        "spend_unverified"
    ]


async def test_paused_redis_admitted_and_its_spend_counted_once_redis_answers(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis, port = start_redis(tmp_path)
    processes.append(redis)
    path = policy(tmp_path, port, spend_timeout_ms=200)  # spend_unverified: admit, the default
    async with in_process(path, exact_tokenizer=False) as (sidecar, driver, _):
        await warmed(driver)
        paused(redis)
        try:
            admitted = await driver.decide("sk-payg", chat())
            assert admitted.status == 200 and admitted.tracking_id is not None
            # It ends while Redis is still paused: its settlement waits for it.
            await driver.report([admitted.outcome(200, 12, 30)])
            tracking_id = admitted.tracking_id

            async def waiting() -> bool:
                backlog = spend_step(sidecar).backlog
                return any(e.reservation_id == tracking_id for e in backlog)

            await eventually(waiting)
        finally:
            resumed(redis)
        unverified = {"tenant": "payg", "action": "admitted", "cause": "timeout"}
        assert sample(sidecar, "slogate_tenant_spend_unverified_total", **unverified) == 1

        await eventually(lambda: backlog_empty(sidecar))
        assert sample(sidecar, "slogate_spend_settlements_retried_total", result="settled") >= 1
        # What it spent, once: whether its reservation landed when Redis resumed or not.
        assert await spent_today(port, "payg") == 12 + 30
    (routed,) = [d for d in decisions(tmp_path) if d["tenant"] == "payg"]
    assert routed["spend"] == "unverified"


async def test_redis_slower_than_the_budgets_but_within_the_spend_timeout_is_checked(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis, port = start_redis(tmp_path)
    processes.append(redis)
    # The full tenant has spent its day already.
    client = connect(f"redis://127.0.0.1:{port}/0")
    store, spans = RedisSpendStore(client), windows({"day": 100}, time.time())
    assert (await store.reserve(SpendHold("full", spans, {}, 100), "before", 600)).admitted
    await store.settle("full", [spans[0].id], "before", 100)
    await client.aclose()
    with CuttableProxy(port) as proxy:
        # Every reply 0.3 s late: far past the budgets' 20 ms, far inside the spend check's
        # 30 s, however loaded the machine.
        path = policy(tmp_path, proxy.port, redis_timeout_ms=20, spend_timeout_ms=30_000)
        async with in_process(path, exact_tokenizer=False) as (sidecar, driver, _):
            proxy.reply_delay_s = 0.3
            checked = await driver.decide("sk-payg", chat())
            exhausted = await driver.decide("sk-full", chat())
            assert checked.status == 200
            assert exhausted.status == 429
            assert exhausted.headers[REASON_HEADER] == "spend_exhausted"
            # The token budget did time out (it decided on its local share) ...
            assert sample(sidecar, "slogate_budget_store_decisions_total", store="local") >= 2
            # ... the spend check did not: it held the request's reservation in Redis.
            assert sample(sidecar, "slogate_tenant_spend_unverified_total") == 0
            assert await spent_today(port, "payg") > 0
            assert checked.tracking_id is not None
            await driver.report([checked.outcome(200, 5, 5)])

            async def settled() -> bool:
                return await spent_today(port, "payg") == 10

            await eventually(settled)
    (routed,) = [d for d in decisions(tmp_path) if d["tenant"] == "payg"]
    assert routed["spend"] == "checked"
