"""The engines' KV events over real ZMQ: a publisher as vLLM runs it (PUB + ROUTER replay) ->
the sidecar's subscriber -> the picker's exact index. A late join and a gap are replayed; a
restart clears the engine's index; without a replay socket a gap clears it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engines.cached_blocks import block_keys
from engines.kv_events import BlockStored, EventBatch
from engines.picker import EnginePicker
from engines.state import EngineFleet
from extproc.runtime.kv_subscriber import KvSubscriber
from policy.domain import KvEvents, Pool
from policy.loader import parse_policy
from policy.schema import EngineHealthConfig
from tests.support.clock import VirtualClock
from tests.support.in_process import in_process
from tests.support.kv_publisher import KvPublisher
from tests.support.stack import example_policy, write_policy

IDS = np.arange(7000, 7000 + 16 * 64, dtype=np.uint32)
EMPTY = EventBatch(0.0, ())


def stored(first: int, count: int, parent: int | None) -> EventBatch:
    """Blocks first..first+count-1 of IDS, hashed as their index + 1."""
    hashes = tuple(range(first + 1, first + count + 1))
    tokens = tuple(int(t) for t in IDS[first * 16 : (first + count) * 16])
    return EventBatch(0.0, (BlockStored(hashes, parent, tokens, 16),))


async def until(done: Callable[[], bool], publisher: KvPublisher, timeout_s: float = 30.0) -> None:
    """Publish empty batches (a scheduler step with nothing stored) until `done`: the
    subscription may join after the first ones (ZMQ's slow joiner)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, "the subscriber never caught up"
        await publisher.publish(EMPTY)
        await asyncio.sleep(0.05)


def matched(picker: EnginePicker, pool: str, slot: int) -> int:
    cached = picker.cached.get(pool)
    if cached is None or not cached.block_size:
        return 0
    return cached.matched_tokens(block_keys(IDS, 16), [slot])[0]


async def test_the_sidecar_follows_an_engine_through_a_gap_and_a_restart(tmp_path: Path) -> None:
    publisher = KvPublisher(topic="kv")
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False
    policy["pools"]["default"]["endpoints"] = ["127.0.0.1:1"]
    policy["pools"]["default"]["kv_events"] = {
        "port": publisher.port,
        "replay_port": publisher.replay_port,
        "topic": "kv",
    }
    path = tmp_path / "policy.yaml"
    write_policy(path, policy)
    try:
        async with in_process(path) as (sidecar, _, _):
            picker = sidecar.signals.engine_watch.picker
            (engine,) = picker.fleet.engines("default")
            # Published before anyone listened: the subscriber replays it when it joins.
            await publisher.publish(stored(0, 8, None))
            await until(lambda: matched(picker, "default", engine.slot) == 128, publisher)
            # A batch lost on the way: the next one shows the gap, the replay brings it.
            await publisher.publish(stored(8, 8, 8), send=False)
            await until(lambda: matched(picker, "default", engine.slot) == 256, publisher)
            # The engine restarted: its numbering starts again, its cache is empty.
            publisher.restart()
            await publisher.publish(stored(0, 2, None))
            await until(lambda: matched(picker, "default", engine.slot) == 32, publisher)
            cached = picker.cached["default"]
            assert cached.blocks(engine.slot) == 2
            metrics = sidecar.metrics.registry
            counts = {
                kind: metrics.get_sample_value(
                    "slogate_kv_events_total",
                    {"pool": "default", "engine": engine.address, "kind": kind},
                )
                for kind in ("gaps", "restarts", "replays", "unreplayed")
            }
            assert counts["gaps"] == 1 and counts["restarts"] == 1
            assert counts["replays"] and counts["replays"] >= 2
            assert counts["unreplayed"] == 0
            held = metrics.get_sample_value(
                "slogate_kv_index_blocks", {"pool": "default", "engine": engine.address}
            )
            assert held == 2
    finally:
        await publisher.close()


@pytest.mark.parametrize("named", [True, False])
async def test_without_a_replay_socket_a_gap_clears_the_engine(named: bool) -> None:
    """Both encodings; two engines on one host, their ports relative to their HTTP ports."""
    publisher = KvPublisher(named=named, replay=False)
    base = parse_policy({})
    http_port = publisher.port - 1000
    spec = Pool(
        "p",
        (("127.0.0.1", http_port), ("127.0.0.1", http_port + 1)),
        kv_events=KvEvents(port=1000, relative_ports=True),
    )
    policy = dataclasses.replace(base, pools={**base.pools, "p": spec})
    clock = VirtualClock()
    fleet = EngineFleet(EngineHealthConfig, clock)
    fleet.sync("p", spec.endpoints)
    picker = EnginePicker(fleet, lambda: policy, clock)
    subscriber = KvSubscriber(picker, lambda: policy)
    task = asyncio.create_task(subscriber.run())
    try:
        first = fleet.engines("p")[0]
        await until(lambda: picker.cached.get("p") is not None, publisher)
        await publisher.publish(stored(0, 4, None))
        await until(lambda: matched(picker, "p", first.slot) == 64, publisher)
        counts = subscriber.counts[("p", first.address)]
        before = counts.unreplayed  # a join after the first batch is one too
        await publisher.publish(stored(4, 4, 4), send=False)
        await publisher.publish(EMPTY)
        await until(lambda: counts.unreplayed == before + 1, publisher)
        assert counts.gaps == 1
        assert matched(picker, "p", first.slot) == 0  # what it holds is unknown: cleared
        # The second engine's port (HTTP + 1000 = a port nobody binds) brought nothing.
        assert picker.cached["p"].blocks(fleet.engines("p")[1].slot) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await publisher.close()
