"""The peer probe (extproc.runtime.peer_probe) over real HTTP: a peer whose ingress answers
the ping gets a round trip; one that does not is forgotten, so nothing crosses to it."""

from __future__ import annotations

import math
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from admission.crossing import RoundTrips
from extproc.request.contract import REGION_PING_PATH
from extproc.runtime.peer_probe import PeerProbe
from extproc.service.crossing_metrics import CrossingMetrics
from policy.loader import parse_policy
from tests.support.http import serve_on_loopback
from tooling.stack.processes import free_port


def policy(ingress: dict[str, str]) -> Any:
    return parse_policy(
        {
            "regions": {
                "this": "eu",
                "list": {
                    "eu": {"ingress": "127.0.0.1:1"},
                    **{name: {"ingress": address} for name, address in ingress.items()},
                },
                "ledger": {"url": "redis://127.0.0.1:1/0"},
            }
        }
    )


async def test_an_answering_peer_is_measured_a_silent_one_forgotten() -> None:
    pings = []

    async def ping(request: web.Request) -> web.Response:
        pings.append(request.path)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get(REGION_PING_PATH, ping)
    runner, port = await serve_on_loopback(app)
    links = RoundTrips()
    links.measured("ap", 0.05)  # measured before: its ingress is gone now
    registry = CollectorRegistry()
    metrics = CrossingMetrics(registry)
    ingress = {"us": f"127.0.0.1:{port}", "ap": f"127.0.0.1:{free_port()}"}
    probe = PeerProbe(lambda: policy(ingress), links, metrics)
    try:
        async with aiohttp.ClientSession() as session:
            await probe.probe_once(session)
            first = links.rtt_s("us")
            await probe.probe_once(session)
    finally:
        await runner.cleanup()
    assert pings == [REGION_PING_PATH, REGION_PING_PATH]
    assert first is not None and 0 < first < 2.0
    assert links.rtt_s("us") is not None
    assert links.rtt_s("ap") is None
    name = "slogate_region_link_rtt_seconds"
    assert registry.get_sample_value(name, {"peer": "us"}) == links.rtt_s("us")
    assert math.isnan(registry.get_sample_value(name, {"peer": "ap"}) or 0.0)
