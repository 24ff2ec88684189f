"""A simulated pool as a set of engines, and how Envoy reaches one of them.

What lives here: `SimEngine` (one engine: its KV cache and batch slots, its prefix cache,
whether it is up) and `EnginePool` (a pool's engines, their addresses, and `reach`: what
the generated Envoy configuration does with a request, tooling.render.envoy_config.engines: the
first engine slogate named; a refused connection retried once on the second one named; no
name: round robin over the engines Envoy's health checks still pass). The offline fleet
(sim.fleet.offline) drives them on its virtual clock; the picking itself is the sidecar's own
(engines.picker, through sim.fleet.sidecar).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from breaker.engine import EngineSnapshot
from engines.state import EngineFleet
from sim.fleet.arrivals import Arrival
from sim.server.model import KvCache, PrefixCache, PromptSegment
from sim.server.paged_kv import PagedKvCache


@dataclass(slots=True)
class SimEngine:
    address: str
    kv: KvCache
    prefix: PrefixCache
    waiting: dict[str, tuple[int, Arrival]] = field(default_factory=dict)
    up: bool = True
    down_since_s: float = -math.inf
    # Integral over virtual time, for utilisation: occupancy (the fuller of the KV cache and
    # the batch slots, 0..1) x seconds.
    busy_s: float = 0.0
    served: int = 0
    # When its prefill compute is free again (a fleet that queues prefills: each prompt's
    # uncached tokens take their prefill time, one prompt after another).
    prefill_free_s: float = 0.0
    prompt_tokens: int = 0  # prompt tokens it prefilled or found cached
    cached_tokens: int = 0  # of those, found in its prefix cache

    @property
    def occupancy(self) -> float:
        return max(self.kv.usage_perc, self.kv.num_running / self.kv.max_running)

    def look_up(
        self, segments: Sequence[PromptSegment], prompt_tokens: int, request_id: str = ""
    ) -> int:
        """The prompt tokens its prefix cache holds (and now holds all of it): for an engine
        with a paged KV cache, what the started request found cached in its blocks."""
        if isinstance(self.kv, PagedKvCache):
            cached = min(prompt_tokens, self.kv.hit_tokens(request_id))
        elif segments:
            cached = min(prompt_tokens, self.prefix.lookup_and_insert(segments))
        else:
            cached = 0
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        return cached

    def snapshot(self) -> EngineSnapshot:
        """What its /metrics would say: KV usage, running, waiting, its cache's size."""
        hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None
        return EngineSnapshot(
            self.kv.usage_perc,
            float(self.kv.num_running),
            float(self.kv.num_waiting),
            hit_rate,
            (),
            float(self.kv.capacity_tokens),
        )


def engine_addresses(pool_index: int, count: int) -> list[str]:
    """Made-up addresses, one per engine: what Envoy and the sidecar name them by."""
    return [f"10.{pool_index // 250}.{pool_index % 250}.{i + 1}:8000" for i in range(count)]


class EnginePool:
    def __init__(
        self,
        addresses: Sequence[str],
        capacity_tokens: int,
        max_running: int,
        max_queue: int,
        overcommit_ratio: float,
        prefix_entries: int,
        block_size: int | None = None,
    ) -> None:
        """`block_size`: each engine's KV cache in blocks of that many tokens, its prefix
        cache in them (sim.server.paged_kv); None: a KV cache of weighted tokens beside an LRU
        of `prefix_entries` message prefixes."""
        count = len(addresses)
        self.block_size = block_size
        self.engines = [
            SimEngine(
                address,
                self._kv(
                    max(1, capacity_tokens // count),
                    max(1, max_running // count),
                    max_queue,
                    overcommit_ratio,
                ),
                PrefixCache(prefix_entries),
            )
            for address in addresses
        ]
        self._by_address = {e.address: e for e in self.engines}
        self._next = 0  # Envoy's round robin

    def restart(self, index: int) -> SimEngine:
        """The `index`th engine back up, empty: no cache, nothing running or waiting."""
        old = self.engines[index]
        kv = old.kv
        fresh = SimEngine(
            old.address,
            self._kv(kv.capacity_tokens, kv.max_running, kv.max_queue, kv.overcommit_ratio),
            PrefixCache(old.prefix.max_entries),
            busy_s=old.busy_s,
            served=old.served,
            prompt_tokens=old.prompt_tokens,
            cached_tokens=old.cached_tokens,
        )  # fmt: skip
        self.engines[index] = fresh
        self._by_address[fresh.address] = fresh
        if isinstance(fresh.kv, PagedKvCache):
            fresh.kv.clear()  # what a vLLM that starts publishes first
        return fresh

    def _kv(self, capacity: int, running: int, queue: int, overcommit: float) -> KvCache:
        if self.block_size is None:
            return KvCache(
                capacity, max_running=running, max_queue=queue, overcommit_ratio=overcommit
            )
        return PagedKvCache(
            capacity,
            self.block_size,
            max_running=running,
            max_queue=queue,
            overcommit_ratio=overcommit,
        )

    def get(self, address: str) -> SimEngine | None:
        return self._by_address.get(address)

    def reach(
        self, named: Sequence[str], now_s: float, detect_s: float
    ) -> tuple[SimEngine | None, bool]:
        """The engine a request ends up on, and whether its connection was refused on the
        way (retried). `detect_s`: how long Envoy's health checks take to see one down."""
        first = self.get(named[0]) if named else self._round_robin(now_s, detect_s)
        if first is None or first.up:
            return first, False
        # Refused before any byte: Envoy's one retry, on the second engine named (or any
        # other its round robin gives).
        second = (self.get(named[1]) if len(named) > 1 else None) or self._round_robin(
            now_s, detect_s, avoid=first
        )
        return (second if second is not None and second.up else None), True

    def _round_robin(
        self, now_s: float, detect_s: float, avoid: SimEngine | None = None
    ) -> SimEngine | None:
        healthy = [
            e
            for e in self.engines
            if e is not avoid and (e.up or now_s - e.down_since_s < detect_s)
        ]
        if not healthy:
            return None
        self._next += 1
        return healthy[self._next % len(healthy)]

    def usage_perc(self) -> float:
        """The pool's KV usage: its up engines' mean (all are the same size)."""
        up = [e for e in self.engines if e.up] or self.engines
        return sum(e.kv.usage_perc for e in up) / len(up)

    @property
    def num_waiting(self) -> int:
        return sum(e.kv.num_waiting for e in self.engines)

    @property
    def num_running(self) -> int:
        return sum(e.kv.num_running for e in self.engines)

    def queue_ratio(self) -> float:
        return self.num_waiting / max(1, self.num_running)

    @property
    def busy_s(self) -> float:
        return sum(e.busy_s for e in self.engines) / len(self.engines)

    @property
    def served(self) -> int:
        return sum(e.served for e in self.engines)

    def prefix_hit_rate(self) -> float | None:
        prompts = sum(e.prompt_tokens for e in self.engines)
        return sum(e.cached_tokens for e in self.engines) / prompts if prompts else None


def scrape(pools: Mapping[str, EnginePool], fleets: Sequence[EngineFleet]) -> None:
    """Each sidecar's scrape of every engine that answers: its state's metrics."""
    for name, pool in pools.items():
        for engine in pool.engines:
            if engine.up:
                for fleet in fleets:
                    fleet.observe(name, engine.address, engine.snapshot())


def probe(pools: Mapping[str, EnginePool], fleets: Sequence[EngineFleet]) -> None:
    """Each sidecar's /health probe of every engine."""
    for name, pool in pools.items():
        for engine in pool.engines:
            for fleet in fleets:
                fleet.probed(name, engine.address, engine.up)
