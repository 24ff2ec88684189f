"""The simulated pool with vLLM's prefix caching publishes its KV events on real ZMQ, as
vLLM's --kv-events-config does: what it stores on a PUB socket, and the batches again from
its ROUTER replay socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient, TestServer

from engines.kv_events import BlockStored, EventBatch, decode_batch
from sim.server.engine_ids import chat_ids
from sim.server.pool import POOL_KEY, PoolConfig, create_app, start_kv_events

BLOCK = 16
SYSTEM = "You answer questions about the fleet and its engines. " * 20


@pytest.fixture
async def pool() -> AsyncIterator[TestClient[Any, Any]]:
    config = PoolConfig(
        time_scale=0.0,
        tokenizer="deepseek",
        kv_block_size=BLOCK,
        kv_events_port=0,
        kv_events_replay_port=0,
    )
    app = create_app(config)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1", port=0))
    await client.start_server()
    publisher = await start_kv_events(app[POOL_KEY], "127.0.0.1")
    assert publisher is not None
    yield client
    await client.close()
    await publisher.close()


def _chat(question: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
    }


async def _next_batch(socket: zmq.asyncio.Socket) -> tuple[int, EventBatch]:
    topic, seq, payload = await asyncio.wait_for(socket.recv_multipart(), 30)
    assert topic == b""
    return int.from_bytes(seq, "big"), decode_batch(payload)


async def test_the_pool_publishes_what_it_caches_and_replays_it(
    pool: TestClient[Any, Any],
) -> None:
    assert pool.app is not None
    publisher = pool.app[POOL_KEY].kv_events
    assert publisher is not None and publisher.replay_port is not None
    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{publisher.port}")
    try:
        # A SUB socket drops what was sent before it joined: ask until a batch arrives.
        first: tuple[int, EventBatch] | None = None
        for attempt in range(50):
            response = await pool.post("/v1/chat/completions", json=_chat(f"warm {attempt}?"))
            assert response.status == 200
            try:
                first = await asyncio.wait_for(_next_batch(sub), 0.2)
                break
            except TimeoutError:
                continue
        assert first is not None
        # The engine's ids of the chat, rendered and tokenized as the engine does: the
        # stored blocks carry them.
        question = "Which engine holds the prefix of this long question? " * 8
        response = await pool.post("/v1/chat/completions", json=_chat(question))
        body = await response.json()
        ids = chat_ids(["system", "user"], [SYSTEM, question])
        # The system prompt's blocks were cached by the warm-up: this chat hits them.
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= BLOCK
        stored: list[BlockStored] = []
        while not stored:
            _, batch = await _next_batch(sub)
            stored = [e for e in batch.events if isinstance(e, BlockStored)]
        (event,) = stored
        assert event.block_size == BLOCK
        depth = len(ids) // BLOCK - len(event.block_hashes)
        assert event.token_ids == tuple(
            int(i) for i in ids[depth * BLOCK : len(ids) // BLOCK * BLOCK]
        )
        assert event.parent_block_hash is not None  # below the shared system prompt

        replay = context.socket(zmq.DEALER)
        replay.connect(f"tcp://127.0.0.1:{publisher.replay_port}")
        try:
            await replay.send_multipart((b"", (0).to_bytes(8, "big")))
            seqs = []
            while True:
                _, topic, seq, payload = await asyncio.wait_for(replay.recv_multipart(), 30)
                assert topic == b""
                number = int.from_bytes(seq, "big", signed=True)
                if number == -1:
                    break
                seqs.append(number)
                decode_batch(payload)
            assert seqs == list(range(len(seqs))) and len(seqs) >= 2
        finally:
            replay.close(linger=0)
    finally:
        sub.close(linger=0)
        context.term()
