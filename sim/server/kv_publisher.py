"""A simulated engine's KV event publisher, as vLLM's ZmqEventPublisher runs it.

What lives here: `KvEventPublisher`: a PUB socket that sends each batch as (topic, 8-byte
big-endian sequence number, msgpack payload: engines.kv_events.encode_batch, named maps as
vLLM releases since 2026 send them) and a ROUTER replay socket that answers (empty, start
sequence) with the buffered batches from there on and an end marker of sequence -1. Bound
on the pool's host; port 0 picks a free one (`port`, `replay_port` say which).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio

from engines.kv_events import EventBatch, KvEvent, encode_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)
BUFFER = 10_000  # batches kept for replay (vLLM's default buffer_steps)


class KvEventPublisher:
    def __init__(self, host: str, port: int, replay_port: int | None, topic: str = "") -> None:
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self.port = _bind(self._pub, host, port)
        self._router: zmq.asyncio.Socket | None = None
        self.replay_port: int | None = None
        if replay_port is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self.replay_port = _bind(self._router, host, replay_port)
        self._topic = topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=BUFFER)
        self._replaying: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._router is not None and self._replaying is None:
            self._replaying = asyncio.create_task(self._serve_replay())

    async def publish(self, events: Sequence[KvEvent]) -> None:
        if not events:
            return
        payload = encode_batch(EventBatch(time.time(), tuple(events)))
        seq, self._seq = self._seq, self._seq + 1
        self._buffer.append((seq, payload))
        await self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue  # not a replay request
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._router.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            await self._router.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._replaying is not None:
            self._replaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replaying
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)
        self._context.term()


def _bind(socket: zmq.asyncio.Socket, host: str, port: int) -> int:
    shown = f"[{host}]" if ":" in host else host
    if port == 0:
        return socket.bind_to_random_port(f"tcp://{shown}")
    socket.bind(f"tcp://{shown}:{port}")
    return port
