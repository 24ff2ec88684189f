"""`slogate loadtest`'s requests: `Shot` (one request as its client saw it), its prompt,
and `play` (every arrival sent open-loop at its own scaled time). See tooling.loadtest.run."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from extproc.runtime.loop_lag import LoopLag
from sim.fleet.arrivals import Arrival
from sim.fleet.prompts import library

if TYPE_CHECKING:
    from tooling.loadtest.scrape import ProcessSampler

CHAT = "/v1/chat/completions"


@dataclass
class Shot:
    """One request as its client saw it (seconds are real ones)."""

    tenant: str
    tier: str
    scheduled_s: float  # after the start, scaled
    lag_s: float = 0.0  # how late it left
    stream: bool = True
    prompt_tokens: int = 0  # the workload's size (the engine reports its own in usage)
    max_tokens: int = 0
    status: int = 0  # 0: no answer (connection refused or reset)
    reason: str = ""  # x-slogate-reason of a refusal
    error_json: bool = True  # a refusal came as an OpenAI JSON error with a message
    error_code: str = ""  # its `code` (or `type`): slogate's reason, or the engine's
    # The response's headers: the request got through Envoy and the sidecar (its waiting
    # room included) and the engine took it; TTFT minus this is the engine's queue and
    # prefill (vLLM sends a stream's headers before its first token).
    headers_s: float | None = None
    ttft_s: float | None = None  # first content event; a JSON answer: the whole answer
    latency_s: float | None = None
    completion_tokens: int | None = None
    sent_s: float = 0.0  # after the start
    during_fault: bool = False  # alive while a scheduled fault was
    pool: str = ""  # x-slogate-pool of the answer: the pool that served (or failed) it
    nonce: int = 0  # its place in the run: what makes its prompt its own
    # The generator itself was held (its loop stalled past GENERATOR_STALL_S) while this
    # request was alive, or it left that late: its times include the generator's stall.
    generator_held: bool = False

    def alive_during(self, from_s: float, to_s: float) -> bool:
        """Sent by `to_s` and not answered before `from_s` (seconds after the start)."""
        return self.sent_s <= to_s and self.sent_s + (self.latency_s or 0.0) >= from_s

    @property
    def judged(self) -> bool:
        """What the stack did with it is what it measures: it lived through no fault and
        none of the generator's own stalls."""
        return not self.during_fault and not self.generator_held


# A stall of the generator's own loop this long makes its clock readings of the requests
# alive meanwhile its own, not the stack's (the first token is stamped when the loop runs).
GENERATOR_STALL_S = 0.25


@dataclass
class Played:
    """What `play` returns: each request, and the generator's own stalls (seconds after
    the start: from, to)."""

    shots: list[Shot]
    stalls: list[tuple[float, float]]
    started_late_s: float = 0.0  # after `start_unix`, when play was given one


def messages(arrival: Arrival, nonce: int) -> list[dict[str, str]]:
    """The prompt: a short message of its own first, then the library's texts. The library
    reuses its texts, so without the first message every prompt of a size would be the same
    and an engine's prefix cache would serve them all (a 30k-token prompt's P99 TTFT was
    0.57 s live against the simulator's 2.66 s, which has no prefix cache); real requests
    from different users share no prefix. The sidecar still counts the texts once each."""
    texts = library(arrival.crafted).messages(arrival.prompt_tokens)
    first = {"role": "user", "content": f"Ticket {nonce}:"}
    return [first, *({"role": "user", "content": text} for text in texts)]


async def fire(
    session: aiohttp.ClientSession, url: str, key: str, arrival: Arrival, shot: Shot
) -> None:
    body: dict[str, Any] = {
        "model": "deepseek-v4",
        "messages": messages(arrival, shot.nonce),
        "max_tokens": arrival.max_tokens,
        "stream": arrival.stream,
    }
    if arrival.stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"authorization": f"Bearer {key}"}
    started = time.monotonic()
    try:
        async with session.post(f"{url}{CHAT}", json=body, headers=headers) as reply:
            shot.headers_s = time.monotonic() - started
            shot.status = reply.status
            shot.reason = reply.headers.get("x-slogate-reason", "")
            shot.pool = reply.headers.get("x-slogate-pool", "")
            if reply.status != 200:
                try:
                    error = json.loads(await reply.read())["error"]
                    shot.error_json = bool(error.get("message"))
                    shot.error_code = str(error.get("code") or error.get("type") or "")
                except (ValueError, KeyError, TypeError):
                    shot.error_json = False
                return
            if not arrival.stream:
                answer = json.loads(await reply.read())
                shot.ttft_s = time.monotonic() - started
                shot.completion_tokens = (answer.get("usage") or {}).get("completion_tokens")
                return
            async for raw in reply.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or []
                if shot.ttft_s is None and any(
                    (c.get("delta") or {}).get("content") for c in choices
                ):
                    shot.ttft_s = time.monotonic() - started
                if event.get("usage"):
                    shot.completion_tokens = event["usage"].get("completion_tokens")
    except (aiohttp.ClientError, TimeoutError, ValueError):
        shot.status = shot.status or 0
    finally:
        shot.latency_s = time.monotonic() - started


async def play(
    arrivals: Sequence[Arrival],
    url: str,
    keys: Mapping[str, str],
    time_scale: float = 1.0,
    timeout_s: float = 600.0,
    sampler: ProcessSampler | None = None,
    alongside: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    watch: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    start_unix: float | None = None,
) -> Played:
    """Every arrival sent at its scaled time; returns when the last one is answered.
    Given the clock's start: `alongside` runs meanwhile and is waited for (a fault
    schedule), `watch` runs until the end (a sampler). The generator watches its own loop
    as the sidecar does (a stall over a second is logged with where its threads were), and
    marks each request that lived through one of its stalls. `start_unix`: the wall time
    the first arrival is due (a policy declared ramps against it); later if the prompts
    took longer to build, as `Played.started_late_s` says."""
    sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
    own_lag = LoopLag(time.monotonic, kept_s=math.inf)
    lagging = asyncio.create_task(own_lag.run())
    side: asyncio.Task[None] | None = None
    watching: asyncio.Task[None] | None = None
    for arrival in arrivals:  # build the prompt texts before the clock starts
        library(arrival.crafted)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    shots: list[Shot] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        wait_s = 0.2 if start_unix is None else start_unix - time.time()
        started_late_s = max(0.0, -wait_s)
        start = time.monotonic() + max(0.2, wait_s)
        if alongside is not None:
            side = asyncio.create_task(alongside(start))
        if watch is not None:
            watching = asyncio.create_task(watch(start))
        tasks = []
        for index, arrival in enumerate(arrivals):
            shot = Shot(
                arrival.key.tenant,
                arrival.key.tier.value,
                arrival.at_s * time_scale,
                stream=arrival.stream,
                prompt_tokens=arrival.prompt_tokens,
                max_tokens=arrival.max_tokens,
                nonce=index,
            )
            shots.append(shot)
            delay = start + shot.scheduled_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            shot.lag_s = max(0.0, time.monotonic() - start - shot.scheduled_s)
            tasks.append(asyncio.create_task(fire(session, url, keys[shot.tenant], arrival, shot)))
        await asyncio.gather(*tasks)
    lagging.cancel()
    stalls = [(a - start, b - start) for a, b in own_lag.stalls(GENERATOR_STALL_S)]
    for shot in shots:
        shot.sent_s = shot.scheduled_s + shot.lag_s
        shot.generator_held = shot.lag_s > GENERATOR_STALL_S or any(
            shot.alive_during(*stall) for stall in stalls
        )
    if side is not None:
        await side  # its last fault may outlast the last answer
    if watching is not None:
        watching.cancel()
    if sampling is not None:
        sampling.cancel()
        assert sampler is not None
        sampler.sample()
    return Played(shots, stalls, started_late_s)
