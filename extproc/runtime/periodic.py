"""The sidecar's periodic work: what runs on a timer beside the request path.

What lives here: `every` (a loop that runs some work each interval and survives its
failures), `housekeeping` (policy and candidate file reloads, the expiry of requests
whose access log never came, the KV holds' safety net) and `start_loops`, which starts
them all with their intervals read from the live policy: the waiting room's tick, the
breaker's evaluation, the quota controller, the engine scrapes, probes and discovery, the
key store's sync, the spend settlements' retries, the re-rank of the tenants that keep
metric labels of their own, the fleet's heartbeat, the region agent's reports, and
registers their cancelling on the sidecar's exit stack. Split from the composition root
(extproc.runtime.sidecar), which starts them once its servers listen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from admission.kv.dispatch import ROOM_TICK_S
from extproc.runtime.engine_watch import EngineWatch
from extproc.runtime.key_store import KeyStore
from extproc.runtime.kv_subscriber import start_kv_subscriber
from extproc.runtime.parts import Control, RequestPath
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.region_agent import RegionAgent
from extproc.runtime.stores import Stores
from extproc.service.metrics import SidecarMetrics
from extproc.service.tenant_series import RERANK_INTERVAL_S

# How often settlements the spend store could not take are retried: a paused Redis is
# retried by one call a second, each bounded by the spend timeout.
SPEND_RECONCILE_S = 1.0

# The sidecar's logger: these loops' messages read as they did when they lived there.
log = logging.getLogger("slogate.sidecar")


async def every(
    interval_s: Callable[[], float], work: Callable[[], Awaitable[None] | None]
) -> None:
    """`work()` every `interval_s()` seconds; a failure is logged, the loop goes on."""
    while True:
        await asyncio.sleep(interval_s())
        try:
            done = work()
            if done is not None:
                await done
        except Exception:
            log.exception("periodic %r failed", work)


async def housekeeping(watch_interval_s: float, policy: PolicyHolder, path: RequestPath) -> None:
    """Policy file changes, and the expiry of requests whose access log never came."""
    kv = path.admission.kv
    while True:
        await asyncio.sleep(watch_interval_s)
        if await policy.reload_if_changed():
            await kv.dispatcher.dispatch()  # a new capacity or share may make room
        await path.candidate.reload_if_changed()
        await path.recorder.expire()
        # A KV hold outlives its request only if nothing ever released it: a safety net.
        for request_id in await kv.expire():
            log.warning("KV hold of %s expired without its request's end", request_id)


async def start_loops(
    exits: AsyncExitStack,
    *,
    watch_interval_s: float,
    policy: PolicyHolder,
    path: RequestPath,
    control: Control,
    keys: KeyStore | None,
    engine_watch: EngineWatch,
    stores: Stores,
    metrics: SidecarMetrics,
    region: RegionAgent | None = None,
) -> None:
    """Every periodic task of a sidecar, started; cancelled on the way out. With a shared
    store, this replica's heartbeat into the fleet's count, the first beat counted before
    this returns. With `regions:`, the region agent's first report (or read of the
    region's lease) before this returns too: a global tenant has no share until then."""

    def breaker_interval() -> float:
        return policy().breaker.evaluate_interval_s

    def controller_interval() -> float:
        return policy().breaker.controller_interval_s

    async def control_step() -> None:
        if policy().breaker.controller_enabled:
            await control.quota_loop.step()

    def rerank_tenants() -> None:  # the policy's cap and tenants as they are now
        metrics.rerank_tenants(policy())

    room = path.admission.kv.dispatcher
    tasks = [
        asyncio.create_task(housekeeping(watch_interval_s, policy, path)),
        asyncio.create_task(every(lambda: ROOM_TICK_S, room.tick)),
        asyncio.create_task(every(breaker_interval, control.breaker_loop.tick)),
        asyncio.create_task(every(controller_interval, control_step)),
        asyncio.create_task(every(lambda: RERANK_INTERVAL_S, rerank_tenants)),
        # The seasonal forecasts' refits, each in a process of its own (idle while off).
        asyncio.create_task(control.forecast.run()),
    ]
    spend = path.admission.spend
    if spend is not None:  # settlements the spend store could not take yet, retried
        tasks.append(asyncio.create_task(every(lambda: SPEND_RECONCILE_S, spend.reconcile)))
    if engine_watch.scraper is not None:
        tasks.append(asyncio.create_task(engine_watch.scraper.run()))
    if keys is not None:
        tasks.append(asyncio.create_task(keys.run()))
    tasks += [
        asyncio.create_task(engine_watch.run_probes()),
        asyncio.create_task(engine_watch.run_discovery()),
        # The engines' KV events, for pools whose policy has kv_events (none: it idles).
        start_kv_subscriber(engine_watch.picker, policy, metrics.registry),
    ]
    if region is not None:  # closed after its loop's task is cancelled (last first)
        exits.push_async_callback(region.close)
    exits.callback(_cancel, tasks)
    if region is not None:
        try:
            await region.step()
        except Exception:
            log.exception("the region agent's first step failed; it runs again each interval")
        tasks.append(asyncio.create_task(every(region.interval_s, region.step)))
    members = stores.members
    if members is not None:

        async def heartbeat() -> None:
            metrics.fleet_replicas.set(await members.beat())

        await heartbeat()
        tasks.append(asyncio.create_task(every(lambda: members.interval_s, heartbeat)))


def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
