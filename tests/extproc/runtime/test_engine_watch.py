"""Engine /health probes over real HTTP (aiohttp servers on 127.0.0.1), and the loop-lag
rule: a probe that timed out while the sidecar's own event loop was stalled is not counted
against the engine (extproc.runtime.loop_lag), one that timed out on a lively loop is."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from engines.engine import EngineState
from engines.state import EngineFleet
from extproc.runtime.engine_watch import EngineWatch
from extproc.runtime.loop_lag import LoopLag
from policy.loader import parse_policy
from policy.schema import EngineHealthConfig, Policy
from tests.support.stack import example_policy

TIMEOUT_S = 0.3
HEALTH = EngineHealthConfig(probe_timeout_s=TIMEOUT_S, unhealthy_after=1)


async def _engine(hang: asyncio.Event | None) -> tuple[web.AppRunner, int]:
    """A /health that answers at once, or (hang given) only once `hang` is set."""

    async def health(_: web.Request) -> web.Response:
        if hang is not None:
            await hang.wait()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


def _policy() -> Policy:
    return parse_policy(example_policy())


@pytest.fixture
async def engines() -> AsyncIterator[tuple[int, int, asyncio.Event]]:
    never = asyncio.Event()
    hung, hung_port = await _engine(never)
    fine, fine_port = await _engine(None)
    try:
        yield hung_port, fine_port, never
    finally:
        never.set()
        await hung.cleanup()
        await fine.cleanup()


def _watch(hung_port: int, fine_port: int) -> EngineWatch:
    fleet = EngineFleet(lambda: HEALTH, time.monotonic)
    fleet.sync("p", [("127.0.0.1", hung_port), ("127.0.0.1", fine_port)])
    policy = _policy()
    policy = dataclasses.replace(policy, engines=dataclasses.replace(policy.engines, health=HEALTH))
    return EngineWatch(fleet, lambda: policy, loop_lag=LoopLag(time.monotonic))


def _states(watch: EngineWatch) -> dict[int, EngineState]:
    return {e.port: watch.fleet.state(e) for e in watch.fleet.engines("p")}


async def test_a_hung_engine_is_dead_after_a_timed_out_probe_on_a_lively_loop(
    engines: tuple[int, int, asyncio.Event],
) -> None:
    hung_port, fine_port, _ = engines
    watch = _watch(hung_port, fine_port)
    ticker = asyncio.create_task(watch.loop_lag.run())
    try:
        async with aiohttp.ClientSession() as session:
            await watch.probe_once(session)
    finally:
        ticker.cancel()
    assert _states(watch) == {hung_port: EngineState.DEAD, fine_port: EngineState.SERVING}


async def test_timeouts_during_the_sidecars_own_stall_are_not_counted(
    engines: tuple[int, int, asyncio.Event],
) -> None:
    """The loop blocks for twice the probe timeout while the probes are out (a starved
    sidecar): every timeout of that round says nothing about the engines."""
    hung_port, fine_port, _ = engines
    watch = _watch(hung_port, fine_port)
    ticker = asyncio.create_task(watch.loop_lag.run())
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, time.sleep, 2 * TIMEOUT_S)  # the stall, on the loop itself
    try:
        async with aiohttp.ClientSession() as session:
            await watch.probe_once(session)
        assert watch.loop_lag.worst_since(time.monotonic() - 5) >= TIMEOUT_S
    finally:
        ticker.cancel()
    assert _states(watch)[hung_port] is EngineState.SERVING


def test_the_lag_is_what_the_ticker_overslept_and_a_stall_under_way_counts() -> None:
    now = [100.0]
    lag = LoopLag(lambda: now[0], tick_s=0.05)
    now[0] = 100.05
    lag.woke(100.0)
    assert lag.worst_since(0.0) == pytest.approx(0.0)
    now[0] = 101.0  # slept at 100.05 for 0.05: woke 0.9 s late
    lag.woke(100.05)
    assert lag.worst_since(100.5) == pytest.approx(0.9)
    assert lag.worst_since(101.5) == pytest.approx(0.0)  # nothing recorded since
    now[0] = 103.0  # no wake for 2 s: a stall under way
    assert lag.worst_since(102.9) == pytest.approx(1.95)


def test_the_stalls_kept_are_the_wakes_later_than_asked_from_when_they_were_due() -> None:
    now = [0.0]
    lag = LoopLag(lambda: now[0], tick_s=0.05, kept_s=float("inf"))
    for slept_from, woke in ((0.0, 0.05), (0.05, 0.4), (0.4, 100.0), (100.0, 102.05)):
        now[0] = woke
        lag.woke(slept_from)
    # Due at 0.1 (woke 0.4: 0.3 late), at 0.45 (woke at 100), at 100.05 (woke 2 s late).
    assert _rounded(lag.stalls(0.25)) == [(0.1, 0.4), (0.45, 100.0), (100.05, 102.05)]
    assert _rounded(lag.stalls(1.0)) == [(0.45, 100.0), (100.05, 102.05)]
    short = LoopLag(lambda: now[0], tick_s=0.05)  # the sidecar's: a minute
    now[0] = 0.4
    short.woke(0.0)
    now[0] = 200.0
    short.woke(199.0)
    assert _rounded(short.stalls(0.25)) == [(199.05, 200.0)]


def _rounded(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(round(a, 6), round(b, 6)) for a, b in spans]


def _blocking_work_of_the_sidecar() -> None:
    time.sleep(1.6)  # stands for code that holds the loop


async def test_a_stalled_loop_is_logged_with_where_its_thread_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lag = LoopLag(time.monotonic)
    ticker = asyncio.create_task(lag.run())
    await asyncio.sleep(0.2)
    with caplog.at_level("WARNING", logger="slogate.loop"):
        _blocking_work_of_the_sidecar()
        await asyncio.sleep(0.1)
    ticker.cancel()
    stalls = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert len(stalls) == 1 and "[loop] " in stalls[0], stalls
    assert "_blocking_work_of_the_sidecar" in stalls[0].split("[loop] ")[1].splitlines()[0]
    assert "waited" in stalls[0] and "for a CPU" in stalls[0], stalls  # the kernel's account
