"""An engine's KV event publisher as vLLM's ZmqEventPublisher runs it: a PUB socket sending
(topic, 8-byte big-endian sequence, msgpack batch), a ROUTER replay socket answering
(empty, start sequence) with the buffered batches from there and an end marker of -1.
Real ZMQ on 127.0.0.1, on the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import zmq
import zmq.asyncio

from engines.kv_events import EventBatch, encode_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvPublisher:
    def __init__(self, topic: str = "", named: bool = True, replay: bool = True) -> None:
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self.port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self._router = self._context.socket(zmq.ROUTER) if replay else None
        self.replay_port = (
            self._router.bind_to_random_port("tcp://127.0.0.1") if self._router else None
        )
        self._topic = topic.encode()
        self.named = named
        self.seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=10_000)
        self._task = asyncio.create_task(self._serve_replay()) if self._router else None

    async def publish(self, batch: EventBatch, send: bool = True) -> None:
        """One batch, buffered for replay; `send` False: lost on the way (a gap)."""
        payload = encode_batch(batch, named=self.named)
        seq, self.seq = self.seq, self.seq + 1
        self._buffer.append((seq, payload))
        if send:
            await self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))

    def restart(self) -> None:
        """The engine restarted: its numbering and its buffer start again."""
        self.seq = 0
        self._buffer.clear()

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._router.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            await self._router.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)
        self._context.term()
