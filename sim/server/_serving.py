"""Serving one inference request on a simulated pool: admission, timing plan, JSON or SSE.

`SimPool` owns the pool's mutable state (KV cache, prefix cache, faults, metrics, seeded RNG)
and turns the pure model's draws into sleeps on the event loop. Routing and the CLI live in
`sim.server.pool`; request shapes in `sim.server._openai`, response shapes in `sim.server._frames`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from sim.server._frames import (
    Frame,
    Usage,
    anthropic_error_body,
    error_body,
    filler_token,
    frame_for,
)
from sim.server._openai import (
    Counter,
    Endpoint,
    ParsedRequest,
    RequestError,
    approx_tokens,
    parse_request,
)
from sim.server.config import PoolConfig
from sim.server.engine_ids import chat_ids, prompt_plan
from sim.server.faults import Faults, FaultState
from sim.server.kv_publisher import KvEventPublisher
from sim.server.metrics import PoolMetrics
from sim.server.model import EngineAdmission, KvCache, LatencyModel, PrefixCache, kv_tokens_for
from sim.server.paged_kv import PagedKvCache, PromptPlan

# slogate's headers, and those it sets for an endpoint picker (the inference extension's).
# traceparent/tracestate: the trace context the engine would nest its own spans under.
SAW_HEADERS_PREFIXES = ("x-slogate-", "x-gateway-", "x-llm-d-", "traceparent", "tracestate")


@dataclass(frozen=True, slots=True)
class _Plan:
    """When the tokens of one admitted request come out, in event-loop time."""

    arrived_at: float
    first_token_at: float
    token_interval_s: float
    completion_tokens: int
    finish_reason: str
    cached_tokens: int


async def _sleep_until(deadline: float) -> None:
    # Deadlines, not per-token sleeps, so scheduling overhead never accumulates into the plan.
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def echo_headers(
    request: web.Request,
    stream_options: dict[str, Any] | None,
    model: str | None = None,
    max_tokens: int | None = None,
    priority: int = 0,
) -> dict[str, str]:
    """What the upstream saw, for tests: slogate's headers, stream_options, model, the
    output limit the body named and its scheduling priority."""
    saw: dict[str, str] = {}
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered.startswith(SAW_HEADERS_PREFIXES):
            saw[lowered] = f"{saw[lowered]}, {value}" if lowered in saw else value
    return {
        "x-sim-saw-headers": json.dumps(saw, sort_keys=True),
        "x-sim-stream-options": json.dumps(stream_options, sort_keys=True),
        "x-sim-model": json.dumps(model),
        "x-sim-max-tokens": json.dumps(max_tokens),
        "x-sim-priority": str(priority),
    }


_ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "overloaded_error"}


def error_response(
    status: int,
    message: str,
    error_type: str,
    code: str,
    headers: dict[str, str] | None = None,
    endpoint: Endpoint | None = None,
) -> web.Response:
    """An error in the API's own shape: vLLM's for the OpenAI APIs (`type` from the status,
    `code` the status), Anthropic's for the Messages API. What the simulator means by it
    (`code`, e.g. context_length_exceeded, sim_fault) goes in `x-sim-error`, for tests."""
    if endpoint is Endpoint.MESSAGES:
        body = anthropic_error_body(message, _ANTHROPIC_TYPES.get(status, "api_error"))
    else:
        body = error_body(status, message)
    return web.json_response(body, status=status, headers={**(headers or {}), "x-sim-error": code})


def _usage(parsed: ParsedRequest, plan: _Plan) -> Usage:
    """What the pool reports: a reasoning request reasoned half of what it generated."""
    reasoning = plan.completion_tokens // 2 if parsed.reasoning else 0
    return Usage(parsed.prompt_tokens, plan.completion_tokens, plan.cached_tokens, reasoning)


class SimPool:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.latency = LatencyModel(config.latency_config(), self.rng)
        self.kv = (
            KvCache(
                config.kv_capacity_tokens,
                max_running=config.max_running_requests,
                max_queue=config.max_queue,
                overcommit_ratio=config.kv_overcommit_ratio,
            )
            if config.kv_block_size is None
            else PagedKvCache(
                config.kv_capacity_tokens,
                config.kv_block_size,
                max_running=config.max_running_requests,
                max_queue=config.max_queue,
                overcommit_ratio=config.kv_overcommit_ratio,
            )
        )
        # Where the paged cache's KV events go (set by the server that binds its sockets).
        self.kv_events: KvEventPublisher | None = None
        self.prefix_cache = PrefixCache(config.prefix_cache_entries)
        self.faults = FaultState()
        self.metrics = PoolMetrics(config.model, config.kv_capacity_tokens)
        self.count_tokens: Counter = approx_tokens
        if config.tokenizer == "deepseek":
            from sim.server.tokenizer import shared_bpe  # one counter per process, not per pool

            self.count_tokens = shared_bpe().count
        self._admitted: dict[str, asyncio.Future[None]] = {}
        self._next_request = 0

    async def serve(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        arrived_at = asyncio.get_running_loop().time()
        try:
            parsed = parse_request(await request.read(), endpoint, self.count_tokens)
        except RequestError as exc:
            headers = echo_headers(request, None)
            return error_response(
                400, exc.message, "invalid_request_error", exc.code, headers, endpoint
            )
        headers = echo_headers(
            request,
            parsed.stream_options,
            parsed.requested_model,
            parsed.named_max_tokens,
            parsed.priority,
        )
        context_tokens = parsed.prompt_tokens + parsed.max_tokens
        if context_tokens > self.config.max_model_len_tokens:
            message = (
                f"context of {context_tokens} tokens (prompt + max_tokens) exceeds the "
                f"model's maximum of {self.config.max_model_len_tokens}"
            )
            return error_response(
                400, message, "invalid_request_error", "context_length_exceeded", headers, endpoint
            )
        served = self.config.served_models
        if served and parsed.requested_model is not None and parsed.requested_model not in served:
            message = (
                f"The model `{parsed.requested_model}` does not exist. "
                f"Valid aliases: {', '.join(served)}."
            )
            return error_response(404, message, "not_found_error", "model_not_found", headers)
        faults = self.faults.current()
        if faults.error_rate > 0 and self.rng.random() < faults.error_rate:
            return error_response(
                faults.error_status,
                "injected fault",
                "server_error",
                "sim_fault",
                headers,
                endpoint,
            )
        return await self._admit_and_run(request, parsed, faults, arrived_at, headers)

    async def _admit_and_run(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        faults: Faults,
        arrived_at: float,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        self._next_request += 1
        request_id = f"{self.config.name}-{self._next_request}"
        kv_tokens = kv_tokens_for(
            parsed.prompt_tokens, parsed.max_tokens, self.latency.config.buckets
        )
        # vLLM's FCFS scheduler accepts an integer priority and ignores it.
        priority = parsed.priority if self.config.scheduling_policy == "priority" else 0
        if isinstance(self.kv, PagedKvCache):
            # A chat's blocks are cached; other APIs' prompts are held, uncached.
            held = PromptPlan((), (), parsed.prompt_tokens + parsed.max_tokens)
            if parsed.chat:
                ids = chat_ids([r for r, _ in parsed.chat], [t for _, t in parsed.chat])
                held = prompt_plan(ids, self.kv.block_size, parsed.max_tokens)
            self.kv.plan(request_id, held)
        admission = self.kv.submit(request_id, kv_tokens, priority)
        await self._publish()
        if admission is EngineAdmission.REJECTED_TOO_LARGE:
            message = f"request needs {kv_tokens} KV tokens, the pool has {self.kv.capacity_tokens}"
            return error_response(
                400, message, "invalid_request_error", "context_length_exceeded", headers
            )
        if admission is EngineAdmission.REJECTED_QUEUE_FULL:
            return error_response(
                503,
                "the engine is overloaded: KV cache full and waiting queue at its limit",
                "server_error",
                "overloaded",
                {**headers, "Retry-After": "1"},
            )
        try:
            if admission is EngineAdmission.QUEUED:
                admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._admitted[request_id] = admitted
                await admitted
            if self.kv.is_overcommitted and self.rng.random() < self.config.overcommit_error_rate:
                message = "KV cache exhausted (overcommitted)"
                return error_response(500, message, "server_error", "kv_cache_oom", headers)
            plan = self._plan(parsed, faults, arrived_at, request_id)
            frame = frame_for(parsed, self.config.model)
            try:
                if parsed.stream:
                    return await self._stream(request, parsed, plan, frame, headers)
                return await self._respond(parsed, plan, frame, headers)
            except asyncio.CancelledError:
                # The client went away (handler cancellation) or the server is stopping.
                self.metrics.request_finished("abort")
                raise
        finally:
            self._admitted.pop(request_id, None)
            for admitted_id in self.kv.release(request_id):
                waiter = self._admitted.get(admitted_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            await self._publish()

    async def _publish(self) -> None:
        """What the paged cache stored, evicted or cleared since last asked, as one batch of
        KV events (dropped when nobody publishes them)."""
        if isinstance(self.kv, PagedKvCache) and self.kv.events:
            events = self.kv.drain_events()
            if self.kv_events is not None:
                await self.kv_events.publish(events)

    def _plan(
        self, parsed: ParsedRequest, faults: Faults, arrived_at: float, request_id: str
    ) -> _Plan:
        running = self.kv.num_running
        found = (
            self.kv.hit_tokens(request_id)
            if isinstance(self.kv, PagedKvCache)
            else self.prefix_cache.lookup_and_insert(parsed.segments)
        )
        cached_tokens = min(found, parsed.prompt_tokens)
        self.metrics.prefix_queries.inc(parsed.prompt_tokens)
        self.metrics.prefix_hits.inc(cached_tokens)
        ttft_s = self.latency.sample_ttft_s(parsed.prompt_tokens, running, cached_tokens)
        context_tokens = parsed.prompt_tokens + parsed.max_tokens
        decode_s = self.latency.sample_decode_s_per_token(running, context_tokens)
        if not parsed.endpoint.generates:
            completion_tokens = 0
        elif parsed.ignore_eos:
            completion_tokens = parsed.max_tokens
        else:
            completion_tokens = self.latency.sample_output_tokens(parsed.max_tokens)
        scale = self.config.time_scale
        now = asyncio.get_running_loop().time()
        return _Plan(
            arrived_at=arrived_at,
            first_token_at=now + ttft_s * scale + faults.latency_ms / 1_000,
            token_interval_s=decode_s * scale,
            completion_tokens=completion_tokens,
            finish_reason="length" if completion_tokens >= parsed.max_tokens else "stop",
            cached_tokens=cached_tokens,
        )

    def _first_token_out(self, parsed: ParsedRequest, plan: _Plan) -> float:
        now = asyncio.get_running_loop().time()
        self.metrics.ttft_s.observe(now - plan.arrived_at)
        self.metrics.prompt_tokens.inc(parsed.prompt_tokens)
        return now

    def _finished(self, plan: _Plan, first_token_at: float) -> None:
        now = asyncio.get_running_loop().time()
        self.metrics.e2e_s.observe(now - plan.arrived_at)
        if plan.completion_tokens > 1:
            self.metrics.tpot_s.observe((now - first_token_at) / (plan.completion_tokens - 1))
        self.metrics.request_finished(plan.finish_reason)

    async def _respond(
        self, parsed: ParsedRequest, plan: _Plan, frame: Frame, headers: dict[str, str]
    ) -> web.Response:
        await _sleep_until(plan.first_token_at)
        first_token_at = self._first_token_out(parsed, plan)
        tokens = max(0, plan.completion_tokens - 1)
        await _sleep_until(plan.first_token_at + tokens * plan.token_interval_s)
        self.metrics.generation_tokens.inc(plan.completion_tokens)
        self._finished(plan, first_token_at)
        text = "".join(filler_token(i) for i in range(plan.completion_tokens))
        usage = _usage(parsed, plan)
        body = frame.full_response(text, plan.finish_reason, usage)
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def _stream(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        plan: _Plan,
        frame: Frame,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        usage_field = parsed.include_usage
        try:
            head = frame.stream_head()  # what vLLM sends before the first token (Responses)
            if head:
                await response.write(head)
            await _sleep_until(plan.first_token_at)
            first_token_at = self._first_token_out(parsed, plan)
            opening = frame.stream_open(usage_field)
            if opening:
                await response.write(opening)
            last = plan.completion_tokens - 1
            for index in range(plan.completion_tokens):
                await _sleep_until(plan.first_token_at + index * plan.token_interval_s)
                finish = plan.finish_reason if index == last else None  # as vLLM sends it
                await response.write(frame.stream_token(filler_token(index), usage_field, finish))
                self.metrics.generation_tokens.inc()
            usage = _usage(parsed, plan)
            await response.write(frame.stream_close(plan.finish_reason, usage, usage_field))
            await response.write_eof()
        except ConnectionResetError:
            # The client went away mid-write; the finally in _admit_and_run frees its KV cache.
            self.metrics.request_finished("abort")
            return response
        self._finished(plan, first_token_at)
        return response
