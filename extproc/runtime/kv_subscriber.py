"""Following the engines' KV events: one ZMQ subscription per discovered engine of every pool
whose policy has `kv_events`, each batch handed to the picker (EnginePicker.kv_events). The
I/O half of engines.kv_events and engines.cached_blocks.

What lives here: `KvSubscriber` (reconciles the subscriptions with the fleet every
`RECONCILE_S`: an engine discovered gets one, an engine gone or a pool turned off loses
its own) and `KvEventsCollector` (its counters and the index's size on /metrics).

The engine's side (vLLM `ZmqEventPublisher`): a PUB socket sends (topic, 8-byte big-endian
sequence number, msgpack batch) per scheduler step; a ROUTER replay socket answers a
request of (empty frame, 8-byte start sequence) with every buffered batch from there, as
(empty, topic, seq, payload) messages, then an end marker whose sequence is -1.

Sequence numbers, per engine:
- the first batch seen after subscribing, or a gap (a number skipped: the PUB socket
  dropped or the subscription joined late): the missing batches are asked of the replay
  socket; without one, or when it does not answer within `REPLAY_TIMEOUT_S`, the engine's
  index is cleared (what it holds is unknown) and rebuilt from the next batches;
- a number going back: the engine restarted (its prefix cache is empty): its index is
  cleared, and the batches before this one are replayed.
A batch that does not decode is counted and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from engines.kv_events import BadBatch, decode_batch
from engines.picker import EnginePicker
from policy.domain import KvEvents
from policy.schema import Policy

log = logging.getLogger("slogate.kv_events")

RECONCILE_S = 1.0
REPLAY_TIMEOUT_S = 2.0
_END_SEQ = -1


@dataclass(slots=True)
class FollowCounts:
    """One engine's subscription, since the sidecar started."""

    batches: int = 0  # applied, live or replayed
    gaps: int = 0  # sequence numbers skipped
    restarts: int = 0  # sequence numbers going back
    replays: int = 0  # replay requests answered
    replayed: int = 0  # batches they brought
    unreplayed: int = 0  # gaps nobody replayed: the index cleared
    bad: int = 0  # payloads or messages that did not decode


class KvSubscriber:
    def __init__(
        self,
        picker: EnginePicker,
        policy: Callable[[], Policy],
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self._picker = picker
        self._policy = policy
        self._context = context or zmq.asyncio.Context.instance()
        self._follows: dict[tuple[str, str], tuple[KvEvents, asyncio.Task[None]]] = {}
        self.counts: dict[tuple[str, str], FollowCounts] = {}

    def reconcile(self) -> None:
        """One subscription per engine of every pool with `kv_events`, no other."""
        policy = self._policy()
        wanted: dict[tuple[str, str], tuple[KvEvents, str, int]] = {}
        for pool, engines in self._picker.fleet.table().items():
            spec = policy.pools.get(pool)
            if spec is None or spec.kv_events is None:
                continue
            for engine in engines:
                wanted[(pool, engine.address)] = (spec.kv_events, engine.host, engine.port)
        for key, (config, task) in list(self._follows.items()):
            if key not in wanted or wanted[key][0] != config or task.done():
                task.cancel()
                del self._follows[key]
        for key, (config, host, port) in wanted.items():
            if key not in self._follows:
                task = asyncio.create_task(self._follow(key[0], key[1], host, port, config))
                self._follows[key] = (config, task)

    async def run(self) -> None:
        try:
            while True:
                self.reconcile()
                await asyncio.sleep(RECONCILE_S)
        finally:
            self.close()

    def close(self) -> None:
        for _, task in self._follows.values():
            task.cancel()
        self._follows.clear()

    async def _follow(
        self, pool: str, address: str, host: str, port: int, config: KvEvents
    ) -> None:
        counts = self.counts.setdefault((pool, address), FollowCounts())
        pub_port, replay_port = config.ports(port)
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, config.topic.encode())
        sub.connect(f"tcp://{host}:{pub_port}")
        replay_at = None if replay_port is None else f"tcp://{host}:{replay_port}"
        expected: int | None = None
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    counts.bad += 1
                    continue
                seq = int.from_bytes(frames[1], "big")
                if expected is not None and seq < expected:
                    counts.restarts += 1
                    log.info(
                        "kv events: %s restarted (sequence %d after %d)", address, seq, expected - 1
                    )
                    self._picker.kv_events_lost(pool, address)
                    expected = 0
                if expected is None or seq > expected:
                    start = 0 if expected is None else expected
                    if expected is not None:
                        counts.gaps += seq - expected
                    replayed = await self._replay(
                        address, replay_at, config.topic, start, seq, counts
                    )
                    complete = (bool(replayed) and replayed[0][0] == start) or start == seq
                    if not complete:
                        counts.unreplayed += 1
                        self._picker.kv_events_lost(pool, address)
                    for _, payload in replayed:
                        self._apply(pool, address, payload, counts)
                        counts.replayed += 1
                self._apply(pool, address, frames[2], counts)
                expected = seq + 1
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kv events: following %s failed", address)
        finally:
            sub.close(linger=0)

    def _apply(self, pool: str, address: str, payload: bytes, counts: FollowCounts) -> None:
        try:
            batch = decode_batch(payload)
        except BadBatch as error:
            counts.bad += 1
            log.debug("kv events: a bad batch from %s: %s", address, error)
            return
        counts.batches += 1
        self._picker.kv_events(pool, address, batch)

    async def _replay(
        self, address: str, at: str | None, topic: str, start: int, end: int, counts: FollowCounts
    ) -> list[tuple[int, bytes]]:
        """Batches [start, end) as the engine's replay socket still buffers them (its buffer
        may no longer reach back to `start`), in order; none without a replay socket or an
        answer within REPLAY_TIMEOUT_S."""
        if at is None or start >= end:
            return []
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(at)
        batches: list[tuple[int, bytes]] = []
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                if not await dealer.poll(REPLAY_TIMEOUT_S * 1000):
                    log.warning("kv events: %s's replay socket did not answer", address)
                    return []
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    counts.bad += 1
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == _END_SEQ:
                    break
                if start <= seq < end and (not topic or frames[1] == topic.encode()):
                    batches.append((seq, frames[3]))
            counts.replays += 1
            return batches
        finally:
            dealer.close(linger=0)


class KvEventsCollector(Collector):
    """The subscriptions' counters and each engine's exact index on /metrics."""

    def __init__(self, subscriber: KvSubscriber, picker: EnginePicker) -> None:
        self._subscriber = subscriber
        self._picker = picker

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        labels = ["pool", "engine"]
        follows = CounterMetricFamily(
            "slogate_kv_events",
            "KV event batches and sequence events per engine: applied (live or replayed), "
            "gaps (sequence numbers skipped), restarts, replays, replayed (batches), "
            "unreplayed (gaps nobody replayed: the engine's index cleared), bad.",
            labels=[*labels, "kind"],
        )
        blocks = CounterMetricFamily(
            "slogate_kv_index_events",
            "Blocks the engine's events stored and removed in its exact index, and those "
            "dropped (dropped_gap: parent never seen; ignored: another tier, group, block "
            "size or keyed; evicted: over kv_events.max_blocks).",
            labels=[*labels, "kind"],
        )
        held = GaugeMetricFamily(
            "slogate_kv_index_blocks",
            "Blocks the engine's exact index holds (what its prefix cache holds, from its events).",
            labels=labels,
        )
        for key, counts in self._subscriber.counts.items():
            names = list(key)
            for kind in ("batches", "gaps", "restarts", "replays", "replayed", "unreplayed", "bad"):
                follows.add_metric([*names, kind], getattr(counts, kind))
        for pool, cached in self._picker.cached.items():
            addresses = {e.slot: e.address for e in self._picker.fleet.engines(pool)}
            for slot, index_counts in cached.counts.items():
                engine = addresses.get(slot)
                if engine is None:
                    continue
                names = [pool, engine]
                held.add_metric(names, cached.blocks(slot))
                for kind, value in (
                    ("stored", index_counts.stored),
                    ("removed", index_counts.removed),
                    ("cleared", index_counts.cleared),
                    ("dropped_gap", index_counts.gaps),
                    ("ignored", index_counts.ignored),
                    ("evicted", index_counts.evicted),
                ):
                    blocks.add_metric([*names, kind], value)
        return (follows, blocks, held)


def start_kv_subscriber(
    picker: EnginePicker, policy: Callable[[], Policy], registry: CollectorRegistry
) -> asyncio.Task[None]:
    """The subscriber on the running loop, its metrics registered."""
    subscriber = KvSubscriber(picker, policy)
    registry.register(KvEventsCollector(subscriber, picker))
    return asyncio.create_task(subscriber.run())
