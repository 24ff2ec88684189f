"""`slogate preflight --drills`: a breaker drill to L3 and back on a live pool, with
requests running through it, and each degradation preset (a level's row of
breaker.shedding's table) drilled in turn with one request per row entry it changes.

It changes a live gateway: the drills force levels through the admin API, so requests of
lower tiers are refused while they run (seconds). Whatever happens, the drill is ended
(level 0) before this returns. The verdicts are tooling.preflight.checks'.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from breaker.levels import BreakerLevel
from breaker.shedding import LONG_CONTEXT_TOKENS, Action, shed
from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.service import admin_client
from policy.domain import Tier
from tooling.preflight.checks import (
    CheckResult,
    HeldStream,
    PresetProbe,
    held_requests,
    preset,
    recovered,
)

CHAT = "/v1/chat/completions"
LONG_MAX_TOKENS = LONG_CONTEXT_TOKENS + 100  # context over the cap with a one-word prompt
# Per level, the requests whose answer the level changes (tier, long context): L1 sheds
# sheddable long ones, L2 all sheddable and caps standard, L3 reroutes critical.
PRESET_PROBES: dict[int, tuple[tuple[Tier, bool], ...]] = {
    1: ((Tier.SHEDDABLE, True), (Tier.SHEDDABLE, False)),
    2: ((Tier.SHEDDABLE, False), (Tier.STANDARD, True), (Tier.STANDARD, False)),
    3: ((Tier.STANDARD, False), (Tier.CRITICAL, False)),
}


@dataclass(frozen=True)
class DrillSettings:
    url: str  # the gateway (Envoy's listener)
    admin: str  # the sidecar's admin API
    token_file: Path | None  # its admin token (None: the one the CLI finds)
    pool: str  # the pool drilled: where short requests are routed
    fallback_pool: str
    model: str
    keys: Mapping[Tier, str]  # one key per tier
    streams: int = 4  # streamed requests held through the drill
    stream_tokens: int = 1024  # each one's max_tokens: long enough to outlive the drill
    recovery_timeout_s: float = 30.0
    # L3 is held this long at least, so that Prometheus records it (one and a half of its
    # scrape intervals): the monthly check (last_l3) and its alert see the drill.
    l3_hold_s: float = 0.0


def expected_action(level: int, tier: Tier, long_context: bool) -> str:
    """breaker.shedding's answer, as preflight_checks.preset reads it."""
    verdict = shed(BreakerLevel(level), tier, LONG_MAX_TOKENS + 10 if long_context else 10)
    if verdict.action is Action.REFUSE:
        return f"refuse:{verdict.reason}"
    return "reroute" if verdict.action is Action.REROUTE else "admit"


def _body(model: str, max_tokens: int, stream: bool) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _stream(session: aiohttp.ClientSession, s: DrillSettings, key: str) -> HeldStream:
    """One streamed request read to its end."""
    headers = {"authorization": f"Bearer {key}"}
    body = _body(s.model, s.stream_tokens, True)
    status, events, finish, done = 0, 0, None, False
    try:
        async with session.post(f"{s.url}{CHAT}", json=body, headers=headers) as reply:
            status = reply.status
            if status != 200:
                return HeldStream(status, 0, None, False)
            async for raw in reply.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                events += 1
                for choice in json.loads(line[6:]).get("choices", []):
                    finish = choice.get("finish_reason") or finish
    except (aiohttp.ClientError, TimeoutError):
        pass  # cut (or never answered: status 0): not whole, judged by held_requests
    return HeldStream(status, events, finish, done)


async def _ask(
    session: aiohttp.ClientSession, s: DrillSettings, tier: Tier, long_context: bool
) -> PresetProbe:
    body = _body(s.model, LONG_MAX_TOKENS if long_context else 1, False)
    headers = {"authorization": f"Bearer {s.keys[tier]}"}
    async with session.post(f"{s.url}{CHAT}", json=body, headers=headers) as reply:
        await reply.read()
        return PresetProbe(
            tier.value,
            long_context,
            reply.status,
            reply.headers.get("x-slogate-reason", ""),
            reply.headers.get("x-slogate-pool", ""),
        )


def _held_counts(status: pb.StatusReply, pool: str) -> tuple[int, int]:
    """The pool's requests running (what the sidecar holds on it; else its engines'
    gauges) and waiting (the waiting room's, and the engines' queues)."""
    running = sum(int(e.running) for e in status.engines if e.pool == pool)
    waiting = sum(int(e.waiting) for e in status.engines if e.pool == pool)
    for admission in status.admission:
        if admission.pool == pool:
            running = max(running, int(admission.requests_held))
            waiting += sum(admission.waiting.values())
    return running, waiting


async def _all_in(
    stub: pb_grpc.AdminStub, pool: str, streams: list[asyncio.Task[HeldStream]]
) -> tuple[int, int]:
    """Waits until every stream is running or waiting on the pool (or has ended): the drill
    must find them admitted. The pool's running and waiting requests then."""
    deadline = time.monotonic() + 30.0
    while True:
        status = await stub.Status(pb.StatusRequest(), timeout=5)
        running, waiting = _held_counts(status, pool)
        ended = sum(1 for task in streams if task.done())
        if running + waiting + ended >= len(streams) or time.monotonic() > deadline:
            return running, waiting
        await asyncio.sleep(0.05)


async def _drill(stub: pb_grpc.AdminStub, pool: str, level: int) -> None:
    # 5 minutes: if preflight dies mid-drill, the level lapses by itself.
    await stub.Drill(pb.DrillRequest(pool=pool, level=level, minutes=5.0), timeout=5)


async def _presets(
    session: aiohttp.ClientSession, stub: pb_grpc.AdminStub, s: DrillSettings
) -> list[CheckResult]:
    results = []
    for level in (3, 2, 1):
        await _drill(stub, s.pool, level)
        entered = time.monotonic()
        probes = [
            (await _ask(session, s, tier, long_context), expected_action(level, tier, long_context))
            for tier, long_context in PRESET_PROBES[level]
            if tier in s.keys
        ]
        results.append(preset(level, s.pool, probes, s.fallback_pool))
        if level == 3:
            await asyncio.sleep(max(0.0, s.l3_hold_s - (time.monotonic() - entered)))
    return results


async def _recovery(session: aiohttp.ClientSession, s: DrillSettings) -> float | None:
    """Seconds until a request of the lowest tier with a key is served by the pool again."""
    tier = next(t for t in (Tier.SHEDDABLE, Tier.STANDARD, Tier.CRITICAL) if t in s.keys)
    started = time.monotonic()
    while time.monotonic() - started < s.recovery_timeout_s:
        probe = await _ask(session, s, tier, False)
        if probe.status == 200 and probe.pool == s.pool:
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    return None


async def drill(s: DrillSettings) -> list[CheckResult]:
    """Streams admitted, then L3 (and L2, L1: the presets) drilled on the pool, then the
    drill ended; the streams' ends, the presets and the recovery judged."""
    channel, stub = admin_client.stub(s.admin, s.token_file)
    timeout = aiohttp.ClientTimeout(total=120.0)
    stream_key = s.keys.get(Tier.STANDARD) or s.keys[Tier.CRITICAL]
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            streams = [
                asyncio.create_task(_stream(session, s, stream_key)) for _ in range(s.streams)
            ]
            try:
                running, waiting = await _all_in(stub, s.pool, streams)
                try:
                    results = await _presets(session, stub, s)
                finally:
                    await _drill(stub, s.pool, 0)
                outliving = sum(1 for task in streams if not task.done())
                served_after_s = await _recovery(session, s)
                ended = await asyncio.gather(*streams)
            except BaseException:
                for task in streams:  # the drill broke off: no stream is left running
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                raise
            held = [h for h in ended if h.status == 200]  # those refused were never held
            return [
                held_requests(s.pool, held, running, waiting, outliving),
                *results,
                recovered(s.pool, served_after_s, s.recovery_timeout_s),
            ]
    finally:
        await channel.close()
