"""The round trip to each peer region, measured: what crossing adds to a request's latency.

What lives here: `PeerProbe`, which every `PROBE_INTERVAL_S` times one small request to each
peer region's ingress (its Envoy answers `REGION_PING_PATH` itself: no sidecar, no engine,
so the time is the link's and the peer Envoy's) into `admission.crossing.RoundTrips` (an
EWMA) and the `slogate_region_link_rtt_seconds{peer}` gauge. A probe that fails or times out
forgets the peer's round trip: nothing crosses to a region this one cannot reach (a
partition hangs TCP: the timeout, `PROBE_TIMEOUT_S`, is what notices it). Started by the
sidecar where the policy has regions with ingresses; each round reads the live policy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from admission.crossing import RoundTrips
from extproc.request.contract import REGION_PING_PATH
from extproc.service.crossing_metrics import CrossingMetrics
from policy.schema import Policy

log = logging.getLogger("slogate.regions")

PROBE_INTERVAL_S = 1.0
# Far above any round trip crossing may add (`max_added_ms`, 200 ms by default): a slower
# answer is a link that is not there.
PROBE_TIMEOUT_S = 2.0


class PeerProbe:
    def __init__(
        self,
        policy: Callable[[], Policy],
        links: RoundTrips,
        metrics: CrossingMetrics,
        clock: Callable[[], float] = time.perf_counter,
        this: str | None = None,
    ) -> None:
        """`this`: `slogate serve --region` (None: the policy's `regions.this`)."""
        self._this = this
        self._policy = policy
        self._links = links
        self._metrics = metrics
        self._clock = clock

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        regions = self._policy().regions
        peers = [p for p in regions.peers(self._this) if p.ingress is not None]
        await asyncio.gather(*(self._probe(session, p.name, str(p.ingress)) for p in peers))

    async def _probe(self, session: aiohttp.ClientSession, peer: str, ingress: str) -> None:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        began = self._clock()
        try:
            async with session.get(f"http://{ingress}{REGION_PING_PATH}", timeout=timeout) as r:
                await r.read()
                answered = r.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            answered = False
        if answered:
            rtt_s: float | None = self._links.measured(peer, self._clock() - began)
        else:
            self._links.failed(peer)
            rtt_s = None
        self._metrics.link(peer, rtt_s)

    async def run(self) -> None:
        # One connection per peer, kept: a probe times the request, not a TCP handshake.
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    await self.probe_once(session)
                except Exception:
                    log.exception("probing the peer regions failed")
                await asyncio.sleep(PROBE_INTERVAL_S)
