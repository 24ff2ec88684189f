"""A ten-thousand-key policy: served through the real Envoy, reloaded off the event loop
while requests flow, and the collector kept from walking what lives as long as the process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.metrics import SidecarMetrics
from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import start_stack, wait_for
from tooling.benchmarks.tenants import generated_key, many_tenants_policy


@pytest.fixture(scope="module")
def big_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return many_tenants_policy(tmp_path_factory.mktemp("tenants"), tenants=1000, keys=10_000)


def test_a_reload_builds_the_policy_off_the_event_loop(big_policy: Path) -> None:
    """While the ten-thousand-key policy is read and built, the loop goes on: work queued
    on it after the reload began finishes before the reload does. (Built on the loop, the
    reload finished first: nothing else ran until it returned.)"""

    async def scenario() -> None:
        holder = PolicyHolder(big_policy, SidecarMetrics())
        first = holder()
        reload = asyncio.create_task(holder.reload_error())
        await asyncio.sleep(0)  # the reload has started: its thread reads the file
        ticks = 0
        while not reload.done() and ticks < 1000:
            await asyncio.sleep(0.001)
            ticks += 1
        assert await reload is None
        assert ticks >= 10, ticks  # the loop ran all along
        assert holder() is not first and holder().key_for(generated_key(5000)) is not None

    asyncio.run(scenario())


def test_reloads_wait_for_each_other(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("keys:\n  - {key: sk-a, tenant: a}\n")
    holder = PolicyHolder(path, SidecarMetrics())

    async def scenario() -> list[str | None]:
        return list(await asyncio.gather(*(holder.reload_error() for _ in range(4))))

    assert asyncio.run(scenario()) == [None] * 4
    value = holder._metrics.registry.get_sample_value
    assert value("slogate_policy_reloads_total", {"result": "ok"}) == 4


_FROZEN_PROBE = """
import asyncio, gc, sys
from extproc.runtime import heap

def build(size):
    assert not gc.isenabled() and sys.getswitchinterval() == heap.BUILD_SWITCH_INTERVAL_S
    return [[i] for i in range(size)]

async def main():
    kept = await heap.off_loop(build, 1000)
    # Not a sidecar process: nothing frozen, the collector and the interval are back.
    assert gc.get_freeze_count() == 0 and gc.isenabled(), gc.get_freeze_count()
    assert sys.getswitchinterval() == 0.005
    heap.freeze_at_start()
    frozen = gc.get_freeze_count()
    assert frozen > 1000, frozen
    # Two builds at once: the interval stays short until the last one ends.
    more, again = await asyncio.gather(heap.off_loop(build, 5000), heap.off_loop(build, 10))
    assert gc.get_freeze_count() >= frozen + 5000, (gc.get_freeze_count(), frozen)
    assert gc.isenabled() and sys.getswitchinterval() == 0.005
    try:
        await heap.off_loop(int, "not a number")
    except ValueError:
        pass
    assert gc.isenabled() and sys.getswitchinterval() == 0.005
    print("ok")

asyncio.run(main())
"""


def test_builds_off_the_loop_restore_the_collector_and_freeze_in_a_sidecar() -> None:
    """In a fresh interpreter: a build runs with the collector paused and the switch
    interval short, both restored after (after two at once, after a failure too); the
    collector is left alone until `freeze_at_start`, then what a build returns is frozen."""
    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.e2e
def test_ten_thousand_keys_through_envoy_and_reloads_under_load(
    tmp_path: Path, big_policy: Path
) -> None:
    stack = start_stack(tmp_path, big_policy)
    try:
        url = stack.url
        # A key from the middle of the list works; one not in it is refused.
        middle = post(url, CHAT, chat_body(), key=generated_key(5000))
        assert middle.status == 200, middle.body
        unknown = post(url, CHAT, chat_body(), key="sk-gen-99999")
        assert unknown.status == 401, unknown.body
        assert unknown.json()["error"]["code"] == "invalid_api_key", unknown.body
        # Requests flow from two clients while the sidecar reloads the policy three times:
        # every one is answered, by the engine (200) or as refused by its key's own
        # limits (429) — never an Envoy timeout (504) or a reset.
        statuses: list[int] = []
        over = threading.Event()

        def client(index: int) -> None:
            while not over.is_set():
                reply = post(url, CHAT, chat_body(f"q{index}"), key=generated_key(index))
                statuses.append(reply.status)

        threads = [threading.Thread(target=client, args=(i,)) for i in (4000, 6000)]
        for t in threads:
            t.start()
        assert stack.sidecar is not None and stack.sidecar.pid is not None

        def reloads() -> float:
            return metric(scrape(stack.metrics_url), "slogate_policy_reloads_total", result="ok")

        try:
            for count in (1, 2, 3):
                os.kill(stack.sidecar.pid, signal.SIGHUP)
                done = wait_for(lambda n=count: reloads() >= n, timeout_s=60)
                assert done, stack.sidecar.log_text()[-2000:]
        finally:
            over.set()
            for t in threads:
                t.join(60)
        assert statuses and set(statuses) <= {200, 429}, sorted(set(statuses))
        assert statuses.count(200) >= 3
    finally:
        stack.stop()


def test_the_controller_steps_ten_thousand_keys_in_slices(big_policy: Path) -> None:
    """Every key's budget is stepped each interval, with the loop's other work between
    slices (in one go it held every request 80-280 ms each 5 s); a tenant's demand
    metric is the sum of its keys' (it was whichever key came last)."""
    from extproc.runtime.loops import KEYS_PER_SLICE
    from extproc.runtime.sidecar import Sidecar

    async def scenario() -> None:
        sidecar = Sidecar(big_policy, metrics_port=None, admin_address=None)
        policy = sidecar.policy()
        tenant_keys = [k for k in policy.keys.values() if k.tenant == "tenant-0500"]
        assert len(tenant_keys) == 10
        for i, key in enumerate(tenant_keys):
            sidecar.key_quotas.observe(key.key_id, 100.0 * (i + 1))
        turns = 0
        stepping = True

        async def other_work() -> None:
            nonlocal turns
            while stepping:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        turns = 0
        await sidecar.quota_loop.step()
        stepping = False
        await other
        assert turns >= len(policy.keys) // KEYS_PER_SLICE - 1, turns
        value = sidecar.metrics.registry.get_sample_value
        per_minute = 60.0 / policy.breaker.controller_interval_s
        actual = value(
            "slogate_tenant_demand_tokens_per_minute", {"tenant": "tenant-0500", "kind": "actual"}
        )
        assert actual == pytest.approx(sum(100.0 * (i + 1) for i in range(10)) * per_minute)
        await sidecar.stop()

    asyncio.run(scenario())
