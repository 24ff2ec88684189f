"""The regions lab's load generator (`slogate bench regions`): aiohttp, open loop, from the
root namespace; every answer recorded as a `Shot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from tooling.benchmarks.regions_lab import LabRegion, RegionLab
from tooling.benchmarks.regions_readings import Sample, Shot, read_sample

# -- the load ------------------------------------------------------------------------------


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": "a question from the regions lab"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # exactly max_tokens out: every request weighs the same
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


class Load:
    """The load generator: open loop, every answer recorded as a `Shot`."""

    def __init__(self, lab: RegionLab, started: float) -> None:
        import aiohttp

        self.lab = lab
        self.started = started
        self.shots: list[Shot] = []
        self.samples: list[Sample] = []
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.monotonic() - self.started

    async def close(self) -> None:
        await self.settle()
        await self._session.close()

    async def settle(self, timeout_s: float = 90.0) -> None:
        """Until every request sent has its answer."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    async def one(
        self, phase: str, region: LabRegion, key: str, max_tokens: int, stream: bool = False
    ) -> None:
        shot = Shot(phase, region.name, key, self.now())
        self.shots.append(shot)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        began = time.monotonic()
        try:
            async with self._session.post(
                f"{region.url}/v1/chat/completions",
                data=json.dumps(_body(max_tokens, stream)),
                headers=headers,
            ) as reply:
                shot.status = reply.status
                pool = reply.headers.get("x-sim-pool") or ""
                shot.served = next(
                    (r.name for r in self.lab.regions if pool.startswith(f"{r.name}-")), None
                )
                if reply.status != 200:
                    raw = await reply.read()
                    shot.error = reply.headers.get("x-slogate-reason", "")  # the sidecar's why
                    if not shot.error:
                        with contextlib.suppress(ValueError, AttributeError, KeyError):
                            shot.error = str(json.loads(raw)["error"].get("code", ""))
                elif stream:
                    first = await reply.content.readany()
                    shot.ttft_s = time.monotonic() - began
                    shot.tokens = _stream_tokens(first + await reply.read())
                else:
                    usage = json.loads(await reply.read()).get("usage") or {}
                    shot.tokens = int(usage.get("total_tokens") or 0)
        except Exception as err:  # a client-side failure is a result, not a crash
            shot.error = type(err).__name__
        shot.latency_s = time.monotonic() - began

    def fire(self, *args: Any, **kwargs: Any) -> None:
        task = asyncio.create_task(self.one(*args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def offer(
        self,
        phase: str,
        rate_per_s: float,
        duration_s: float,
        pick: Callable[[int], tuple[LabRegion, str]],
        max_tokens: int,
        stream: bool = False,
    ) -> None:
        """Open loop: request k at start + k / rate, to `pick(k)`'s region with its key."""
        start = time.monotonic()
        count = round(rate_per_s * duration_s)
        for k in range(count):
            wait = start + k / rate_per_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            region, key = pick(k)
            self.fire(phase, region, key, max_tokens, stream)
        # The phase lasts its duration: a rate over it counts every request sent in it.
        await asyncio.sleep(max(0.0, start + duration_s - time.monotonic()))

    async def sample(self, region: LabRegion) -> Sample | None:
        try:
            async with self._session.get(region.metrics_url) as reply:
                text = await reply.text()
        except Exception:
            return None
        got = read_sample(text, self.now(), region.name, "demo-global")
        self.samples.append(got)
        return got

    async def watch(self, stop: asyncio.Event, every_s: float = 0.25) -> None:
        while not stop.is_set():
            await asyncio.gather(*(self.sample(r) for r in self.lab.regions))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)

    async def metrics_text(self, region: LabRegion) -> str:
        async with self._session.get(region.metrics_url) as reply:
            return await reply.text()


def _stream_tokens(raw: bytes) -> int:
    """prompt + completion from a stream's usage event (0 without one)."""
    for line in reversed(raw.decode("utf-8", errors="replace").splitlines()):
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage") or {}
            if usage:
                return int(usage.get("total_tokens") or 0)
    return 0
