"""A ten-thousand-key policy: reloaded off the event loop, and the collector kept from walking
what lives as long as the process. Served through the real Envoy while it reloads under
load: tests/e2e/extproc/runtime/test_policy_holder_scale.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.metrics import SidecarMetrics
from policy.domain import ApiKey
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
import asyncio, gc, sys, weakref
from extproc.runtime import heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

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
    # A request's cyclic garbage made while a reload installs on the loop: collected
    # before the freeze, not kept in the permanent generation for good.
    with heap.collector_paused():
        garbage = cycle()
        await asyncio.sleep(0)
    assert garbage() is None, "frozen garbage"
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
    collector is left alone until `freeze_at_start`, then what a build returns is frozen
    and the garbage made meanwhile is not."""
    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_controller_steps_ten_thousand_keys_in_slices(big_policy: Path) -> None:
    """Every key's budget is stepped each interval, with the loop's other work between
    slices (in one go it held every request 80-280 ms each 5 s); a tenant's demand
    metric is the sum of its keys' (it was whichever key came last); removed keys' budgets
    are dropped."""
    from extproc.runtime.loops import KEYS_PER_SLICE
    from extproc.runtime.sidecar import Sidecar

    async def scenario() -> None:
        sidecar = Sidecar(big_policy, metrics_port=None, admin_address=None)
        policy = sidecar.policy()
        tenant_keys = [k for k in policy.keys.values() if k.tenant == "tenant-0500"]
        assert len(tenant_keys) == 10
        for i, key in enumerate(tenant_keys):
            sidecar.signals.key_quotas.observe(key.key_id, 100.0 * (i + 1))
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
        await sidecar.control.quota_loop.step()
        stepping = False
        await other
        assert turns >= len(policy.keys) // KEYS_PER_SLICE - 1, turns
        value = sidecar.metrics.registry.get_sample_value
        per_minute = 60.0 / policy.breaker.controller_interval_s
        actual = value(
            "slogate_tenant_demand_tokens_per_minute", {"tenant": "tenant-0500", "kind": "actual"}
        )
        assert actual == pytest.approx(sum(100.0 * (i + 1) for i in range(10)) * per_minute)

        def budgets(keys: list[ApiKey]) -> int:
            return len({k.budget_id for k in keys if k.limits.tokens_per_minute is not None})

        quotas = sidecar.signals.key_quotas
        assert quotas.budget_count() == budgets(list(policy.keys.values())) > 100
        # The next interval after a reload that removed keys: theirs are gone with them.
        kept = list(policy.keys.values())[:100]
        await sidecar.control.quota_loop._step_keys(kept, None)
        assert quotas.budget_count() == budgets(kept)
        await sidecar.stop()

    asyncio.run(scenario())
