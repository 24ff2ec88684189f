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

from breaker.engine import EngineReadings, parse_engine_metrics
from policy import EngineKind

log = logging.getLogger("slogate.engine")


class EngineScraper(EngineReadings):
    """EngineReadings fed by scraping every endpoint's /metrics, read with the names of
    the engine each pool runs (`kinds`: pool -> vLLM or SGLang; absent: vLLM)."""

    def __init__(
        self,
        endpoints: Callable[[], Mapping[str, Iterable[tuple[str, int]]]],
        kinds: Callable[[], Mapping[str, EngineKind]] = dict,
        **options: Any,
    ) -> None:
        super().__init__(endpoints, **options)
        self.kinds = kinds

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        kinds = self.kinds()

        async def one(pool: str, host: str, port: int) -> None:
            try:
                async with session.get(f"http://{host}:{port}/metrics") as response:
                    if response.status != 200:
                        return
                    text = await response.text()
                kind = kinds.get(pool, EngineKind.VLLM)
                self.record(pool, host, port, parse_engine_metrics(text, kind))
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.debug("scraping %s:%d failed: %s", host, port, error)

        await asyncio.gather(
            *(one(pool, h, p) for pool, eps in self.endpoints().items() for h, p in eps)
        )

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.interval_s / 2))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.scrape_once(session)
                await asyncio.sleep(self.interval_s)
