"""Warm before ready: what a sidecar does once before it reports ready, so that no client
pays for its first decisions (issue 31: the first decision after a start took 25-50 ms,
the first 30k-token one 100-250 ms, against 1-2 ms for the hundredth).

What lives here: `warm_up`. It counts texts of each kind the counter treats apart — short
(on the event loop), long (on every worker thread at once, so each thread has started and
counted) and non-ASCII (short on the loop, long on the threads) — then sends one chat
request through the real ext_proc servicer, request flow and admission chain.

What must not happen here: anything a client decision leaves. Every piece of state the
warm-up touches is its own throwaway: its own prompt counter (the sidecar's tokenizer and
threads, not its cache), its own budget store, KV book and in-flight table, its own metrics
registry, a synthetic caller no policy names, and no decision log, traffic record, tracer
or engine picker. What it shares is only read: the policy, the breaker board, the pools'
live view. A warm-up that fails or overruns is logged and the sidecar starts anyway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from typing import Any, cast

import grpc

from admission.assembly import build_admission
from breaker.board import BreakerBoard
from budget.key_quotas import KeyQuotas
from budget.store import InProcessStore
from extproc.envoypb.envoy.config.core.v3 import base_pb2 as core
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.flow import Decider
from extproc.request.inflight import InFlight
from extproc.request.tokens.prompt import PromptCounter, TokenCounter
from extproc.runtime.events import MetricsEvents
from extproc.service.ext_proc import ExternalProcessorService
from extproc.service.metrics import SidecarMetrics
from policy.domain import ApiKey, Limits, Pool, Tier
from policy.schema import Policy

log = logging.getLogger("slogate.warm_up")

# Past this the sidecar reports ready anyway: a slow first decision beats no sidecar.
WARM_UP_TIMEOUT_S = 5.0
# Each kind is counted this many times (distinct texts: the first call of a path is the
# slow one, the next confirm it is warm).
_TEXTS_PER_KIND = 3
_SENTENCE = (
    "a gateway counts each prompt before it routes the request and charges its "
    "budget while engines answer requests of many lengths"
)
_WORDS = _SENTENCE.split()
_NON_ASCII = "計数する前にゲートウェイは要求を読む Проверка подсчёта токенов перед запуском 🚦✓ "
_CALLER = ApiKey("warm-up:" + "0" * 56, "slogate-warm-up", Tier.STANDARD, Limits())
_WARM_UP_PATH = "/v1/chat/completions"


async def warm_up(
    policy: Callable[[], Policy],
    bpe: TokenCounter | None,
    executor: Executor,
    board: BreakerBoard,
    live: Callable[[Pool], Pool],
    timeout_s: float = WARM_UP_TIMEOUT_S,
) -> dict[str, float] | None:
    """Milliseconds per kind (short, long, non_ascii, decision), also logged in one line;
    None when the warm-up failed or ran past `timeout_s` (logged: the caller goes on).
    `bpe` None: no tokenizer (every count is the byte bound), only the decision warms."""

    # Nested: it reads the warm-up's arguments, and only the timeout wraps it.
    async def warm() -> tuple[dict[str, float], str]:
        current = policy()
        config = current.counting
        counter = PromptCounter(bpe, config, executor)  # the tokenizer and threads, its own cache
        rng = random.Random(0)
        workers = max(1, config.workers)
        # Well past what the loop counts (and past where a text is cut): a 30k-token prompt's
        # ~150 KB, whose buffers a thread first grows; under the byte bound, which would leave
        # the prompt uncounted.
        long_bytes = 4 * max(config.inline_max_bytes, config.split_min_bytes)
        long_bytes = min(long_bytes, config.max_bytes // (workers + 1))
        unicode_bytes = min(
            config.inline_unicode_max_bytes + 1024, config.max_bytes // (workers + 1)
        )
        block_tokens = current.engines.picking.block_tokens
        took: dict[str, float] = {}

        async def timed(kind: str, prompts: Callable[[], list[list[str]]]) -> None:
            started = time.perf_counter()
            for _ in range(_TEXTS_PER_KIND):
                for texts in prompts():
                    await counter.count(texts)
                    await counter.count(texts, block_tokens=block_tokens)  # the picker's hashes
            took[kind] = (time.perf_counter() - started) * 1000

        await timed("short", lambda: [[_english(rng, 64)]])
        # One long text per worker in one prompt: the threads all start and count at once.
        await timed("long", lambda: [[_english(rng, long_bytes) for _ in range(workers)]])
        # Short on the loop, then long on the threads.
        await timed(
            "non_ascii",
            lambda: [
                [_non_ascii(rng, 512)],
                [_non_ascii(rng, unicode_bytes) for _ in range(workers)],
            ],
        )
        started = time.perf_counter()
        outcome = await _one_decision(policy, counter, board, live, _english(rng, 2048))
        took["decision"] = (time.perf_counter() - started) * 1000
        return took, outcome

    try:
        took, outcome = await asyncio.wait_for(warm(), timeout_s)
    except TimeoutError:
        log.warning("warm-up ran past %.1f s; ready without it", timeout_s)
        return None
    except Exception:
        log.exception("warm-up failed; ready without it")
        return None
    shown = ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in took.items())
    log.info("warm-up took %s (%s)", shown, outcome)
    return took


async def _one_decision(
    policy: Callable[[], Policy],
    counter: PromptCounter,
    board: BreakerBoard,
    live: Callable[[Pool], Pool],
    text: str,
) -> str:
    """One chat request through the servicer, the flow and the chain, on throwaway state.
    A refusal (a pool the breaker sheds at start, say) warms the same path and is fine;
    which it was is returned for the log line."""
    current = policy()
    metrics = SidecarMetrics()  # its own registry: the sidecar's /metrics never sees it
    # The real clock even where the sidecar runs on a virtual one (the simulator's
    # comparison): nothing on it outlives the warm-up.
    clock = time.monotonic
    ttl_s = current.upstream_timeout_s + 60.0
    admission = build_admission(
        board=board,
        store=InProcessStore(),
        events=MetricsEvents(metrics, KeyQuotas(current.breaker.controller_interval_s)),
        clock=clock,
        ttl_s=ttl_s,
        rng=random.Random(0),  # not the sidecar's: a seeded run draws as it would have
        policy=policy,
        live=live,
    )
    decider = Decider(
        policy=policy,
        identity=_WarmUpCaller(),
        counter=counter,
        admission=admission.chain,
        inflight=InFlight(clock, ttl_s),
    )
    servicer = ExternalProcessorService(decider, metrics, message_timeout_ms=1000)
    body = json.dumps(
        {
            "model": "slogate-warm-up",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 8,
        }
    ).encode()
    headers = {
        ":method": "POST",
        ":path": _WARM_UP_PATH,
        ":authority": "slogate-warm-up",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "x-request-id": "slogate-warm-up",
    }
    messages = [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=core.HeaderMap(
                    headers=[
                        core.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()
                    ]
                )
            )
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]
    context = cast(grpc.aio.ServicerContext, None)  # the servicer never reads it
    async for _ in servicer.Process(_stream(messages), context):
        pass
    return _outcome(metrics)


async def _stream(messages: list[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    for message in messages:
        yield message


def _outcome(metrics: SidecarMetrics) -> str:
    """'admitted', or 'refused: <reason>', from the warm-up's own metrics."""
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "slogate_rejections_total" and sample.value > 0:
                return f"refused: {sample.labels.get('reason')}"
    return "admitted"


class _WarmUpCaller:
    """The identity of the warm-up request: a caller no policy or key store names, so no
    budget, spend or tenant series of a real one is touched."""

    def resolve(
        self, headers: Mapping[str, str], claims: Mapping[str, Any] | None, policy: Policy
    ) -> ApiKey:
        return _CALLER


def _english(rng: random.Random, size_bytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < size_bytes:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _non_ascii(rng: random.Random, size_bytes: int) -> str:
    chars = [rng.choice(_NON_ASCII) for _ in range(size_bytes // 2)]
    return "".join(chars)


__all__ = ["WARM_UP_TIMEOUT_S", "warm_up"]
