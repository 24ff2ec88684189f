"""tooling.loadtest.shots: the open-loop generator against a real HTTP server, and how it
marks the requests it measured through its own stall."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from policy.domain import ApiKey, Tier
from sim.fleet.arrivals import Arrival
from tests.support.http import serve_on_loopback
from tooling.loadtest.shots import GENERATOR_STALL_S, play

BLOCKED_FROM_S, BLOCKED_FOR_S = 0.6, 0.6


async def _answer(request: web.Request) -> web.Response:
    await request.read()
    await asyncio.sleep(0.1)
    return web.json_response({"choices": [], "usage": {"completion_tokens": 3}})


async def test_requests_alive_while_the_generator_was_held_are_marked_and_the_stall_kept() -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _answer)
    runner, port = await serve_on_loopback(app)
    key = ApiKey("0" * 64, "t", Tier.STANDARD)
    arrivals = [Arrival(i * 0.1, key, 10, 3, stream=False) for i in range(16)]

    async def hold_the_loop(start: float) -> None:
        await asyncio.sleep(max(0.0, start + BLOCKED_FROM_S - time.monotonic()))
        time.sleep(BLOCKED_FOR_S)  # noqa: ASYNC251 — the stall under test: the loop held

    try:
        played = await play(
            arrivals, f"http://127.0.0.1:{port}", {"t": "k"}, 1.0, alongside=hold_the_loop
        )
    finally:
        await runner.cleanup()
    shots = played.shots
    assert [s.status for s in shots] == [200] * 16
    # The stall is kept, from when the generator's ticker was due to when it woke.
    inner = (BLOCKED_FROM_S + 0.1, BLOCKED_FROM_S + BLOCKED_FOR_S - 0.1)
    assert any(a <= inner[0] and b >= inner[1] for a, b in played.stalls), played.stalls
    # Those due early in it left late, after it, and are set aside with those alive in it.
    due_inside = [s for s in shots if inner[0] <= s.scheduled_s <= inner[1] - GENERATOR_STALL_S]
    assert due_inside and all(s.lag_s > GENERATOR_STALL_S and s.generator_held for s in due_inside)
    # The first one ended long before; it is judged unless the machine held the generator
    # then too (a stall recorded over its life).
    first = shots[0]
    assert first.generator_held is any(first.alive_during(*stall) for stall in played.stalls)
