"""The real vLLM's KV events (the shared stack's engine publishes them, its sidecar follows
them): what it publishes, that slogate's templated ids give the engine's own block hashes,
and that the translated index finds the prefix the engine reports it cached."""

from __future__ import annotations

import asyncio
import os
import random
import time

import msgspec
import pytest
import zmq

from engines.block_hashes import engine_block_hashes
from engines.cached_blocks import CachedBlocks, block_keys
from engines.kv_events import BlockStored, EventBatch, decode_batch
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.tokens.templated import TemplatedIds
from policy.loader import load_policy
from policy.schema import CountingConfig
from tests.support.http import CHAT, metric, post, scrape
from tests.support.stack import wait_for
from tests.support.vllm import words
from tooling.stack.local import LocalStack

pytestmark = pytest.mark.vllm


def collect(sub: zmq.Socket[bytes], until: float, want: int) -> list[tuple[object, EventBatch]]:
    """(raw msgpack, decoded) batches until `want` blocks were stored or the deadline."""
    batches: list[tuple[object, EventBatch]] = []
    stored = 0
    while time.monotonic() < until and stored < want:
        if sub.poll(200):
            _, _, payload = sub.recv_multipart()
            batch = decode_batch(payload)
            batches.append((msgspec.msgpack.decode(payload), batch))
            stored += sum(len(e.block_hashes) for e in batch.events if isinstance(e, BlockStored))
    return batches


def test_vllm_publishes_blocks_slogate_hashes_and_finds(vllm_stack: LocalStack) -> None:
    stack = vllm_stack
    assert stack.sidecar_policy_path is not None
    config = load_policy(stack.sidecar_policy_path).pools["default"].kv_events
    assert config is not None
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{config.port}")
    try:
        time.sleep(0.5)  # the subscription reaches the PUB socket before the chat is sent
        system = f"Run {random.random()}: " + words(600, 5)  # new to the engine's cache
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
        reply = post(
            stack.url, CHAT, {"model": "deepseek-v4", "messages": messages, "max_tokens": 4}
        )
        assert reply.status == 200, reply.body
        templated = TemplatedIds(PromptCounter(None, CountingConfig()))
        roles, texts = tuple(m["role"] for m in messages), tuple(m["content"] for m in messages)
        ids = asyncio.run(templated.ids(roles, texts, config))
        assert ids is not None
        full = len(ids) // 128
        batches = collect(sub, time.monotonic() + 30, full)
        stored = [e for _, b in batches for e in b.events if isinstance(e, BlockStored)]
        assert stored, "vLLM published no BlockStored"
        raw_event = batches[0][1]
        print(f"\nvLLM's batch: {str(batches[0][0])[:300]}")
        # vLLM 0.32: the batch an array, its events named maps (the 2026 form).
        assert isinstance(batches[0][0], list) and raw_event.events
        first = stored[0]
        assert first.block_size == 128 and first.parent_block_hash is None
        published = [h for e in stored for h in e.block_hashes]
        # The engine hashed exactly slogate's templated ids (its own prompt ids too).
        assert reply.json()["prompt_token_ids"] in (None, ids.tolist())
        seed = os.environ.get("PYTHONHASHSEED")
        assert engine_block_hashes(ids.tolist(), 128, "sha256", seed)[:full] == published[:full]
        # A second chat sharing the system prompt: the index translated from the events
        # finds the prefix the engine says it served from its cache.
        index = CachedBlocks(1000)
        for _, batch in batches:
            index.apply(0, batch)
        again = [messages[0], {"role": "user", "content": "And how?"}]
        second = asyncio.run(templated.ids(("system", "user"), (system, "And how?"), config))
        assert second is not None
        matched = index.matched_tokens(block_keys(second, 128), [0])[0]
        body = {"model": "deepseek-v4", "messages": again, "max_tokens": 4}
        answer = post(stack.url, CHAT, body).json()
        cached = (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
        print(
            f"templated {len(ids)} ids, {len(published)} blocks; matched {matched}, cached {cached}"
        )
        assert matched == cached and matched >= 4 * 128
        # The sidecar follows the same events into its own index.
        assert wait_for(
            lambda: (
                metric(scrape(stack.metrics_url), "slogate_kv_index_blocks", pool="default") >= full
            )
        )
    finally:
        sub.close(linger=0)
        context.term()
