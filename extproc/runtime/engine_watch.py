"""Watching every pool's engines: who they are (DNS), whether they answer (/health), and
what they report (/metrics). The I/O half of engines.state.

What lives here: `resolve_engines` (a pool's endpoints -> its engines' addresses: an IP
as given, a DNS name as every IPv4 address it resolves to, as Envoy's STRICT_DNS clusters
read it) and `EngineWatch`, the loops that keep the fleet (engines.state.EngineFleet) up to
date: discovery every `engines.discovery_interval_s`, a /health probe of every engine every
`engines.health.probe_interval_s` (an answer later than the probe timeout fails it: a hung
engine accepts connections and never answers), and the metrics scrape's snapshots.

A name that does not resolve keeps its last answer: a DNS hiccup must not empty a pool.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable

import aiohttp

from breaker.engine import EngineSnapshot
from engines.engine import EngineState, engine_address
from engines.picker import EnginePicker
from engines.state import EngineFleet
from extproc.runtime.engines import EngineScraper
from extproc.runtime.loop_lag import LoopLag
from policy.schema import Policy

log = logging.getLogger("slogate.engines")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve_engines(
    endpoints: Iterable[tuple[str, int]], known: Iterable[tuple[str, int]] = ()
) -> list[tuple[str, int]]:
    """Every engine the endpoints name; a name that fails to resolve keeps the engines it
    had in `known` (by port: what it resolved to before)."""
    loop = asyncio.get_running_loop()
    engines: dict[tuple[str, int], None] = {}
    before = list(known)
    for host, port in endpoints:
        if _is_address(host):
            engines[(host, port)] = None
            continue
        try:
            infos = await loop.getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
        except OSError as error:
            log.warning(
                "engines: %s:%d does not resolve (%s); keeping its engines", host, port, error
            )
            for old in before:
                if old[1] == port:
                    engines[old] = None
            continue
        for info in infos:
            engines[(str(info[4][0]), port)] = None
    return list(engines)


class EngineWatch:
    def __init__(
        self,
        fleet: EngineFleet,
        policy: Callable[[], Policy],
        on_change: Callable[[str, list[str]], None] = lambda pool, changes: None,
        picker: EnginePicker | None = None,
        scraper: EngineScraper | None = None,
        loop_lag: LoopLag | None = None,
    ) -> None:
        """`on_change(pool, changes)`: discovery or a probe changed the pool's engines.
        `picker`, `scraper`: what `watch_engines` built on the same fleet, kept together."""
        self.fleet = fleet
        self._policy = policy
        self._on_change = on_change
        self.picker = picker or EnginePicker(fleet, policy, fleet.now)
        self.scraper = scraper
        # How late the event loop runs: a probe that timed out while it lagged is not
        # counted (extproc.runtime.loop_lag); ticking while the probes run.
        self.loop_lag = loop_lag or LoopLag(fleet.now)

    def sync_static(self) -> None:
        """The pools' engines as the policy lists them, DNS names left for `discover`
        (what the sidecar knows before its first await)."""
        policy = self._policy()
        for name, spec in policy.pools.items():
            if all(_is_address(host) for host, _ in spec.endpoints):
                self._changed(name, self.fleet.sync(name, spec.endpoints))
        self.fleet.forget_pools(policy.pools)

    async def discover(self) -> None:
        policy = self._policy()
        for name, spec in policy.pools.items():
            known = [(e.host, e.port) for e in self.fleet.engines(name)]
            engines = await resolve_engines(spec.endpoints, known)
            self._changed(name, self.fleet.sync(name, engines))
        self.fleet.forget_pools(policy.pools)

    def _changed(self, pool: str, changes: list[str]) -> None:
        if changes:
            log.info("engines of pool %s: %s", pool, " ".join(changes))
            self._on_change(pool, changes)

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        timeout_s = self._policy().engines.health.probe_timeout_s
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        round_began = self.fleet.now()

        async def one(pool: str, host: str, port: int) -> tuple[str, str, bool | None]:
            """(pool, address, answered); None: it timed out (judged with the lag)."""
            address = engine_address(host, port)
            try:
                async with session.get(f"http://{address}/health", timeout=timeout) as answer:
                    return pool, address, answer.status < 500
            except TimeoutError:
                return pool, address, None
            except (aiohttp.ClientError, OSError):
                return pool, address, False

        results = await asyncio.gather(
            *(one(pool, h, p) for pool, targets in self.fleet.targets().items() for h, p in targets)
        )
        # A stall of half the timeout leaves too little of it for the engine's answer.
        lagged_s = self.loop_lag.worst_since(round_began)
        starved = lagged_s >= timeout_s / 2
        if starved and any(answered is None for _, _, answered in results):
            log.warning(
                "engine probes: timeouts not counted, the sidecar's own loop lagged %.0f ms",
                lagged_s * 1000,
            )
        for pool, address, answered in results:
            if answered is None and starved:
                continue
            self._probed(pool, address, bool(answered))

    def _probed(self, pool: str, address: str, answered: bool) -> None:
        engine = self.fleet.get(pool, address)
        before = None if engine is None else self.fleet.state(engine)
        after = self.fleet.probed(pool, address, answered)
        if after is not None and after != before:
            self._changed(pool, [f"{address}:{after.value}"])
            if after is EngineState.DEAD:
                log.warning("engine %s of pool %s is dead (probes)", address, pool)

    def observe(self, pool: str, host: str, port: int, snapshot: EngineSnapshot) -> None:
        """A metrics scrape's snapshot of one engine (EngineScraper's hook)."""
        self.fleet.observe(pool, engine_address(host, port), snapshot)

    async def run_probes(self) -> None:
        ticker = asyncio.create_task(self.loop_lag.run())
        try:
            await self._probe_forever()
        finally:
            ticker.cancel()

    async def _probe_forever(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    if self._policy().engines.health.probes:
                        await self.probe_once(session)
                except Exception:
                    log.exception("probing the engines failed")
                await asyncio.sleep(self._policy().engines.health.probe_interval_s)

    async def run_discovery(self) -> None:
        while True:
            await asyncio.sleep(self._policy().engines.discovery_interval_s)
            try:
                await self.discover()
            except Exception:
                log.exception("discovering the engines failed")


def watch_engines(policy: Callable[[], Policy], clock: Callable[[], float]) -> EngineWatch:
    """The fleet of every pool's engines, the picker over it, the watch that keeps it up to
    date (its static engines known at once) and the metrics scraper feeding both the
    breaker's readings (over the serving engines) and each engine's state (all of them)."""
    initial = policy()
    stale_after_s = lambda: policy().breaker.stale_after_s  # noqa: E731
    window_s = lambda: policy().breaker.window_s  # noqa: E731
    fleet = EngineFleet(lambda: policy().engines.health, clock, stale_after_s, window_s)
    picker = EnginePicker(fleet, policy, clock, stale_after_s)
    watch = EngineWatch(fleet, policy, picker=picker)
    if initial.breaker.scrape_metrics:
        watch.scraper = EngineScraper(
            fleet.serving_targets,
            lambda: {name: pool.engine for name, pool in policy().pools.items()},
            targets=fleet.targets,
            on_snapshot=watch.observe,
            interval_s=initial.breaker.scrape_interval_s,
            stale_after_s=initial.breaker.stale_after_s,
        )
    watch.sync_static()
    return watch
