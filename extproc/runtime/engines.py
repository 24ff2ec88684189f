"""Scraping vLLM's `/metrics` from every endpoint of every pool, on an interval.

What lives here: `EngineScraper`, the I/O half of the engine signals: it fetches each
endpoint's metrics with aiohttp and hands the parsed snapshot to `breaker.engine
.EngineReadings`, which the breaker reads. A failed or slow endpoint is simply not updated:
its readings go stale, and stale reads as saturated there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from breaker.engine import EngineReadings, EngineSnapshot, parse_engine_metrics
from policy.domain import EngineKind

log = logging.getLogger("slogate.engine")


class EngineScraper(EngineReadings):
    """EngineReadings fed by scraping every endpoint's /metrics, read with the names of
    the engine each pool runs (`kinds`: pool -> vLLM or SGLang; absent: vLLM).
    `targets`: what is scraped (default: `endpoints`, what the readings are taken over:
    the serving engines, while the dead ones are scraped to see them come back);
    `on_snapshot`: told every snapshot (the engine fleet keeps each engine's)."""

    def __init__(
        self,
        endpoints: Callable[[], Mapping[str, Iterable[tuple[str, int]]]],
        kinds: Callable[[], Mapping[str, EngineKind]] = dict,
        targets: Callable[[], Mapping[str, Iterable[tuple[str, int]]]] | None = None,
        on_snapshot: Callable[[str, str, int, EngineSnapshot], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(endpoints, **options)
        self.kinds = kinds
        self.targets = targets or endpoints
        self._on_snapshot = on_snapshot

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        kinds = self.kinds()

        async def one(pool: str, host: str, port: int) -> None:
            try:
                async with session.get(f"http://{host}:{port}/metrics") as response:
                    if response.status != 200:
                        return
                    text = await response.text()
                kind = kinds.get(pool, EngineKind.VLLM)
                snapshot = parse_engine_metrics(text, kind)
                self.record(pool, host, port, snapshot)
                if self._on_snapshot is not None:
                    self._on_snapshot(pool, host, port, snapshot)
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.debug("scraping %s:%d failed: %s", host, port, error)

        await asyncio.gather(
            *(one(pool, h, p) for pool, eps in self.targets().items() for h, p in eps)
        )
        self.forget_out()

    async def run(self) -> None:
        # A busy engine answers /metrics late (vLLM's CPU build took ~4.5 s while it
        # prefilled): wait up to a third of the staleness bound rather than lose the
        # reading. A hung engine is the /health probes' to find (extproc.runtime.
        # engine_watch), not this loop's.
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.stale_after_s / 3))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.scrape_once(session)
                await asyncio.sleep(self.interval_s)
