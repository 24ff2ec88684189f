"""The simulated pool over real HTTP: OpenAI shapes, SSE, faults, KV overload, metrics.

Its command line as a process: tests/e2e/sim/server/test_pool.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from sim.server.model import LatencyConfig
from sim.server.pool import POOL_KEY, PoolConfig, SimPool, create_app

MakeClient = Callable[..., Awaitable[TestClient[Any, Any]]]
CHAT = "/v1/chat/completions"


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    clients: list[TestClient[Any, Any]] = []

    async def make(**config: Any) -> TestClient[Any, Any]:
        config.setdefault("time_scale", 0.001)
        client: TestClient[Any, Any] = TestClient(
            TestServer(create_app(PoolConfig(**config)), host="127.0.0.1", port=0)
        )
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def _pool(client: TestClient[Any, Any]) -> SimPool:
    assert client.app is not None
    return client.app[POOL_KEY]


def _chat(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-v4", "messages": [{"role": "user", "content": text}], **extra}


async def _sse_events(response: aiohttp.ClientResponse) -> list[str]:
    """Raw `data:` payloads in arrival order."""
    events: list[str] = []
    async for line in response.content:
        text = line.decode().strip()
        if text:
            assert text.startswith("data: "), text
            events.append(text.removeprefix("data: "))
    return events


async def _metrics(client: TestClient[Any, Any]) -> dict[str, float]:
    response = await client.get("/metrics")
    assert response.status == 200
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(await response.text()):
        for sample in family.samples:
            if sample.name != "vllm:cache_config_info":  # vLLM's has no model_name either
                assert sample.labels.get("model_name") == "deepseek-v4", sample
            key = sample.name
            if "finished_reason" in sample.labels:
                key += f"{{{sample.labels['finished_reason']}}}"
            if "le" not in sample.labels:
                samples[key] = sample.value
    return samples


async def test_non_streaming_chat_has_openai_shape_and_usage(make_client: MakeClient) -> None:
    client = await make_client(name="default")
    messages = [
        {"role": "system", "content": "x" * 40},  # 10 + 4 tokens
        {"role": "user", "content": [{"type": "text", "text": "y" * 9}]},  # 3 + 4 tokens
    ]
    response = await client.post(CHAT, json={"messages": messages, "max_tokens": 64})
    assert response.status == 200
    assert response.headers["x-sim-pool"] == "default"
    body = await response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "deepseek-v4"
    choice = body["choices"][0]
    usage = body["usage"]
    assert usage["prompt_tokens"] == 21
    assert 1 <= usage["completion_tokens"] <= 64
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len(choice["message"]["content"].split()) == usage["completion_tokens"]
    expected_reason = "length" if usage["completion_tokens"] == 64 else "stop"
    assert choice["finish_reason"] == expected_reason


async def test_ignore_eos_and_max_completion_tokens_fix_the_length(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    body = {**_chat(), "max_completion_tokens": 9, "max_tokens": 500, "ignore_eos": True}
    result = await (await client.post(CHAT, json=body)).json()
    assert result["usage"]["completion_tokens"] == 9
    assert result["choices"][0]["finish_reason"] == "length"


async def test_completions_endpoint(make_client: MakeClient) -> None:
    client = await make_client()
    body = {"prompt": "z" * 400, "max_tokens": 5, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    result = await response.json()
    assert result["object"] == "text_completion" and result["id"].startswith("cmpl-")
    assert result["usage"]["prompt_tokens"] == 100
    assert len(result["choices"][0]["text"].split()) == 5
    tokens = await (await client.post("/v1/completions", json={"prompt": [1, 2, 3]})).json()
    assert tokens["usage"]["prompt_tokens"] == 3


async def test_streaming_sends_one_chunk_per_token_and_no_usage_by_default(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    response = await client.post(CHAT, json=_chat(stream=True, max_tokens=7, ignore_eos=True))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["x-sim-stream-options"] == "null"
    events = await _sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    token_chunks = chunks[1:]
    assert len(token_chunks) == 7
    assert all(len(c["choices"][0]["delta"]["content"].split()) == 1 for c in token_chunks)
    # As vLLM sends it: the last token's chunk carries the finish reason.
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 6 + ["length"]
    assert chunks[-1]["choices"][0]["stop_reason"] is None


async def test_streaming_usage_chunk_only_with_include_usage(make_client: MakeClient) -> None:
    client = await make_client()
    options = {"include_usage": True}
    response = await client.post(CHAT, json=_chat(stream=True, stream_options=options))
    assert json.loads(response.headers["x-sim-stream-options"]) == options
    events = await _sse_events(response)
    assert events[-1] == "[DONE]"
    usage_chunk = json.loads(events[-2])
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    others = [json.loads(e) for e in events[:-2]]
    assert all("usage" not in c for c in others)  # vLLM adds no usage: null (OpenAI does)
    content_chunks = [c for c in others if c["choices"][0]["delta"].get("content")]
    assert usage["completion_tokens"] == len(content_chunks)
    assert usage["prompt_tokens"] == 3 + 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert others[-1]["choices"][0]["finish_reason"] in ("stop", "length")


async def test_streaming_completions(make_client: MakeClient) -> None:
    client = await make_client()
    body = {
        "prompt": "abcd",
        "stream": True,
        "max_tokens": 4,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    events = await _sse_events(await client.post("/v1/completions", json=body))
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 5
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None] * 3 + ["length"]
    assert chunks[4]["usage"]["completion_tokens"] == 4


async def test_chunks_are_flushed_as_tokens_are_produced(make_client: MakeClient) -> None:
    latency = LatencyConfig(base_latency_ms=10, decode_ms_per_token=100, decode_sigma=0.0)
    client = await make_client(time_scale=1.0, latency=latency, base_latency_ms=10)
    started = time.monotonic()
    response = await client.post(CHAT, json=_chat(stream=True, max_tokens=4, ignore_eos=True))
    await response.content.readline()  # role chunk
    first_token_s = time.monotonic() - started
    await _sse_events(response)
    total_s = time.monotonic() - started
    assert first_token_s < 0.15
    assert total_s >= 0.29  # three 100 ms gaps after the first token


async def test_request_headers_are_echoed_for_tests(make_client: MakeClient) -> None:
    client = await make_client()
    headers = {"x-slogate-tenant": "acme", "X-Slogate-Tier": "critical", "x-other": "no"}
    response = await client.post(CHAT, json=_chat(max_tokens=1), headers=headers)
    saw = json.loads(response.headers["x-sim-saw-headers"])
    assert saw == {"x-slogate-tenant": "acme", "x-slogate-tier": "critical"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"messages": []}', "missing_messages"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
         "invalid_max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 200000}',
         "context_length_exceeded"),
    ],
)  # fmt: skip
async def test_bad_requests_get_openai_400s(
    make_client: MakeClient, body: bytes, code: str
) -> None:
    client = await make_client(name="long")
    response = await client.post(CHAT, data=body, headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert response.headers["x-sim-pool"] == "long"
    error = (await response.json())["error"]
    # vLLM's shape; what the simulator meant rides in x-sim-error.
    assert error["code"] == 400 and error["type"] == "BadRequestError" and "param" in error
    assert response.headers["x-sim-error"] == code
    assert error["message"]


async def test_unknown_paths_and_small_endpoints(make_client: MakeClient) -> None:
    client = await make_client(name="fallback", model="static-small")
    missing = await client.get("/nope")
    assert missing.status == 404 and missing.headers["x-sim-pool"] == "fallback"
    assert "error" in await missing.json()
    health = await client.get("/health")
    assert health.status == 200 and health.headers["x-sim-pool"] == "fallback"
    models = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["static-small"]


async def test_fault_latency_and_errors_apply_and_clear(make_client: MakeClient) -> None:
    client = await make_client()
    # The fault's latency is real time, so the reply takes at least that long; it is a second
    # so that a loaded machine alone (a 2-token reply took 0.30 s in one CI run) cannot pass
    # for it. No comparison with an unfaulted reply: that one's time is the machine's.
    set_response = await client.post("/fault", json={"latency_ms": 1000})
    assert (await set_response.json())["latency_ms"] == 1000
    started = time.monotonic()
    assert (await client.post(CHAT, json=_chat(max_tokens=2))).status == 200
    assert time.monotonic() - started >= 1.0

    await client.post("/fault", json={"error_rate": 1.0})
    failed = await client.post(CHAT, json=_chat())
    assert failed.status == 500 and failed.headers["x-sim-pool"] == "default"
    assert (await failed.json())["error"] == {
        "message": "injected fault",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    assert failed.headers["x-sim-error"] == "sim_fault"
    await client.post("/fault", json={"error_rate": 1.0, "error_status": 503})
    assert (await client.post(CHAT, json=_chat())).status == 503

    cleared = await (await client.delete("/fault")).json()
    assert cleared == {
        "latency_ms": 0.0,
        "error_rate": 0.0,
        "error_status": 500,
        "remaining_s": None,
    }
    assert (await client.post(CHAT, json=_chat())).status == 200


async def test_fault_error_rate_is_a_rate(make_client: MakeClient) -> None:
    client = await make_client(seed=3)
    await client.post("/fault", json={"error_rate": 0.5})
    statuses = [(await client.post(CHAT, json=_chat(max_tokens=1))).status for _ in range(60)]
    assert 15 <= statuses.count(500) <= 45
    assert set(statuses) == {200, 500}


async def test_fault_duration_auto_clears(make_client: MakeClient) -> None:
    client = await make_client()
    fault = {"error_rate": 1, "duration_s": 0.1}
    described = await (await client.post("/fault", json=fault)).json()
    assert 0 < described["remaining_s"] <= 0.1
    assert (await client.post(CHAT, json=_chat())).status == 500
    await asyncio.sleep(0.15)
    assert (await (await client.get("/fault")).json())["error_rate"] == 0.0
    assert (await client.post(CHAT, json=_chat())).status == 200


@pytest.mark.parametrize(
    "body",
    [{"error_rate": 2}, {"latency_ms": -1}, {"error_status": 404}, {"bogus": 1}, [1], "x"],
)
async def test_invalid_faults_are_rejected(make_client: MakeClient, body: Any) -> None:
    client = await make_client()
    response = await client.post("/fault", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["type"] == "BadRequestError"
    assert response.headers["x-sim-error"] == "invalid_fault"


async def test_admitted_stream_finishes_when_faults_change(make_client: MakeClient) -> None:
    latency = LatencyConfig(decode_ms_per_token=30, decode_sigma=0.0)
    client = await make_client(time_scale=1.0, latency=latency, base_latency_ms=1)
    body = _chat(stream=True, max_tokens=8, ignore_eos=True)
    response = await client.post(CHAT, json=body)
    await response.content.readline()
    await client.post("/fault", json={"error_rate": 1.0, "latency_ms": 1_000})
    events = await _sse_events(response)
    assert events[-1] == "[DONE]"
    assert len(events) == 8 + 1  # every token (the last with the finish reason), [DONE]
    assert (await client.post(CHAT, json=_chat())).status == 500


async def test_kv_full_queues_then_overloads_with_503(make_client: MakeClient) -> None:
    # Each request needs ~600 weighted KV tokens of 1,000: one runs, one waits, one is refused.
    client = await make_client(kv_capacity_tokens=1_000, max_queue=1)
    await client.post("/fault", json={"latency_ms": 300})
    body = {"prompt": "p" * 1_600, "max_tokens": 200, "ignore_eos": True}
    first = asyncio.create_task(client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    samples = await _metrics(client)
    assert samples["vllm:num_requests_running"] == 1
    assert samples["vllm:num_requests_waiting"] == 1
    assert samples["vllm:kv_cache_usage_perc"] == pytest.approx(0.6)
    refused = await client.post("/v1/completions", json=body)
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert refused.headers["x-sim-error"] == "overloaded"
    assert (await first).status == 200 and (await second).status == 200
    samples = await _metrics(client)
    assert samples["vllm:num_requests_running"] == samples["vllm:num_requests_waiting"] == 0
    assert samples["vllm:kv_cache_usage_perc"] == 0.0


async def test_client_disconnect_frees_kv_cache(make_client: MakeClient) -> None:
    # 200 tokens at 10 ms each: the stream would run 2 s if the disconnect went unnoticed.
    latency = LatencyConfig(decode_ms_per_token=10, decode_sigma=0.0)
    client = await make_client(time_scale=1.0, latency=latency, base_latency_ms=1)
    response = await client.post(CHAT, json=_chat(stream=True, max_tokens=200, ignore_eos=True))
    await response.content.readline()
    assert _pool(client).kv.num_running == 1
    response.close()
    for _ in range(50):
        if _pool(client).kv.num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert _pool(client).kv.num_running == 0
    assert (await _metrics(client))["vllm:request_success_total{abort}"] == 1


async def test_overcommitted_admissions_fail_and_oversized_requests_are_refused(
    make_client: MakeClient,
) -> None:
    client = await make_client(
        kv_capacity_tokens=1_000, kv_overcommit_ratio=2.0, overcommit_error_rate=1.0
    )
    await client.post("/fault", json={"latency_ms": 200})
    body = {"prompt": "p" * 1_600, "max_tokens": 200}
    running = asyncio.create_task(client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    oom = await client.post("/v1/completions", json=body)  # 1,200 of 1,000 tokens in use
    assert oom.status == 500 and oom.headers["x-sim-error"] == "kv_cache_oom"
    assert (await running).status == 200
    huge = await client.post("/v1/completions", json={"prompt": "p" * 8_000, "max_tokens": 1})
    assert huge.status == 400
    assert huge.headers["x-sim-error"] == "context_length_exceeded"


async def test_queued_request_that_hangs_up_leaves_the_queue(make_client: MakeClient) -> None:
    client = await make_client(kv_capacity_tokens=1_000)
    await client.post("/fault", json={"latency_ms": 300})
    body = {"prompt": "p" * 1_600, "max_tokens": 200, "ignore_eos": True}
    running = asyncio.create_task(client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    assert _pool(client).kv.num_waiting == 1
    queued.cancel()
    for _ in range(50):
        if _pool(client).kv.num_waiting == 0:
            break
        await asyncio.sleep(0.01)
    assert _pool(client).kv.num_waiting == 0
    assert (await running).status == 200


async def test_metrics_have_vllm_names_and_move_after_requests(make_client: MakeClient) -> None:
    client = await make_client()
    before = await _metrics(client)
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_time_per_output_token_seconds_count",
    ):
        assert before[name] == 0, name

    body = _chat("same prompt every time", max_tokens=5, ignore_eos=True)
    await client.post(CHAT, json=body)
    await _sse_events(await client.post(CHAT, json={**body, "stream": True}))
    after = await _metrics(client)
    prompt_tokens = 6 + 4
    assert after["vllm:prompt_tokens_total"] == 2 * prompt_tokens
    assert after["vllm:generation_tokens_total"] == 10
    assert after["vllm:request_success_total{length}"] == 2
    assert after["vllm:prefix_cache_queries_total"] == 2 * prompt_tokens
    assert after["vllm:prefix_cache_hits_total"] == prompt_tokens  # the second one hit
    for histogram in (
        "time_to_first_token",
        "e2e_request_latency",
        "request_time_per_output_token",
    ):
        assert after[f"vllm:{histogram}_seconds_count"] == 2
        assert after[f"vllm:{histogram}_seconds_sum"] > 0


async def test_two_pools_in_one_process_keep_separate_metrics(make_client: MakeClient) -> None:
    first = await make_client(name="default")
    second = await make_client(name="long")
    await first.post(CHAT, json=_chat(max_tokens=3, ignore_eos=True))
    assert (await _metrics(first))["vllm:generation_tokens_total"] == 3
    assert (await _metrics(second))["vllm:generation_tokens_total"] == 0
