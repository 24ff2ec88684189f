"""The engines of every pool and the state of each: serving, draining or dead. Pure.

What lives here: `EngineFleet`, which keeps the engines (`Engine`) of
every pool from discovery's lists and answers what the rest of slogate asks: which engines
take new requests, the capacity they add up to (KV admission admits against that), the
pool's KV usage over them, and which engines' answers the breaker leaves out. The clock is
injected; probing, scraping and DNS are the runtime's (extproc.runtime.engine_watch).

How an engine's state moves, and what "no data" means for each signal:
- Dead by probes: `unhealthy_after` failed /health probes in a row (refused, 5xx, or no
  answer within the probe timeout: a hung engine); serving again after `healthy_after`
  answered ones. Before its first probe an engine is serving: Envoy's own health checks
  and the one retry cover the seconds until slogate knows better.
- Dead by answers: `eject_after_errors` 5xx or failed connections in a row take it out
  for `eject_s`, doubled for each ejection in a row (at most 10x): an engine that answers
  its health check but fails its requests. Only answers while it serves count: the
  failures of requests that met it dead (late access-log entries included) do not carry
  over to when it is back. Envoy's outlier detection ejects alike, and
  like it never more than half the pool: when most engines fail, the pool is failing, and
  that is its breaker's to see (a one-engine pool never ejects on answers).
- Draining: an operator's word (admin API); it gets nothing new, its requests finish.
- Metrics that are stale (not scraped within `stale_after_s`) read as a full KV cache for
  a serving engine, as they always did for the pool; a dead engine's are not read at all.
- KV capacity: what the engine reports (`vllm:cache_config_info`), else the pool's
  `kv_capacity_tokens` divided evenly over its engines; batch slots always evenly.

What every request reads of a pool (its serving engines, their sizes, its live capacity) is
a `PoolView` (engines.pool_view), made here and kept until `version` moves (every method
that changes an engine's membership, state or reported size bumps it: a new one must too)
or the clock ends an ejection. `Engine` itself, one engine and its state, is engines.engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from breaker.engine import EngineSnapshot
from engines.engine import Engine, EngineState, HeldOn, engine_address
from engines.pool_view import PoolSizes, PoolView
from policy.domain import Pool
from policy.schema import EngineHealthConfig

MAX_EJECTION_FACTOR = 10


@dataclass(slots=True)
class _PoolEngines:
    engines: dict[str, Engine] = field(default_factory=dict)  # address -> engine
    next_slot: int = 0


class EngineFleet:
    def __init__(
        self,
        health: Callable[[], EngineHealthConfig],
        clock: Callable[[], float],
        stale_after_s: Callable[[], float] = lambda: 15.0,
        window_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """`window_s`: the breaker's window; an engine that was out within it is still
        left out of the pool's signals (`out`)."""
        self._health = health
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._window_s = window_s
        self._pools: dict[str, _PoolEngines] = {}
        self._held: dict[str, HeldOn] = {}  # request id -> what it holds
        # Bumped by every change to what a `PoolView` holds (membership, an engine's
        # state, a reported KV size): the views made before are stale.
        self.version = 0
        self._views: dict[str, PoolView] = {}

    def now(self) -> float:
        return self._clock()

    # -- membership -------------------------------------------------------------------

    def sync(self, pool: str, addresses: Iterable[tuple[str, int]]) -> list[str]:
        """The pool's engines are exactly `addresses` now (discovery's latest answer);
        returns what changed ("+addr", "-addr"). A known engine keeps its state."""
        known = self._pools.setdefault(pool, _PoolEngines())
        wanted = {engine_address(h, p): (h, p) for h, p in addresses}
        changes = [f"-{a}" for a in known.engines if a not in wanted]
        for address in [a for a in known.engines if a not in wanted]:
            del known.engines[address]
        for address, (host, port) in wanted.items():
            if address not in known.engines:
                known.engines[address] = Engine(pool, host, port, known.next_slot)
                known.next_slot += 1
                changes.append(f"+{address}")
        if changes:
            self.version += 1
        return changes

    def forget_pools(self, keep: Iterable[str]) -> None:
        for name in set(self._pools) - set(keep):
            del self._pools[name]
        self.version += 1

    def count(self, pool: str) -> int:
        known = self._pools.get(pool)
        return len(known.engines) if known is not None else 0

    def engines(self, pool: str) -> list[Engine]:
        return list(self.view(pool).engines)

    def view(self, pool: str) -> PoolView:
        """The pool's engines and its serving ones now (kept while nothing changed)."""
        view = self._views.get(pool)
        now_s = self._clock()
        if (
            view is not None
            and view.version == self.version
            and view.made_s <= now_s < view.valid_until_s
        ):
            return view
        known = self._pools.get(pool)
        engines = tuple(known.engines.values()) if known is not None else ()
        # An ejected engine serves again when the clock reaches its end: the view is good
        # until the first such end.
        valid_until_s = min(
            (e.ejected_until_s for e in engines if e.ejected_until_s > now_s), default=math.inf
        )
        view = PoolView(
            version=self.version,
            made_s=now_s,
            valid_until_s=valid_until_s,
            engines=engines,
            serving=tuple(e for e in engines if e.state(now_s) is EngineState.SERVING),
            latest_out_s=max(
                (max(e.ejected_until_s, e.returned_at_s) for e in engines), default=-math.inf
            ),
        )
        self._views[pool] = view
        return view

    def sizes(self, view: PoolView, spec: Pool) -> PoolSizes:
        """What `view`'s serving engines add up to under `spec` (kept with the view)."""
        sizes = view.sizes
        if sizes is not None and sizes.spec is spec:
            return sizes
        kv = tuple(self.kv_tokens(e, spec) for e in view.serving)
        known = [size for size in kv if size is not None]
        sizes = view.sizes = PoolSizes(
            spec=spec,
            kv_tokens=kv,
            largest_kv_tokens=max(known) if known and len(known) == len(kv) else None,
            sequences=self.sequences(spec),
            live=(self._live_pool(view, spec) if len(view.serving) == len(view.engines) else None),
        )
        return sizes

    def get(self, pool: str, address: str) -> Engine | None:
        known = self._pools.get(pool)
        return known.engines.get(address) if known is not None else None

    def find(self, address: str) -> list[Engine]:
        """Every pool's engine at `address` (one server may serve several pools)."""
        return [e for p in self._pools.values() if (e := p.engines.get(address)) is not None]

    def targets(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """Every known engine per pool: what is probed and scraped (the dead included, to
        see them come back)."""
        return {
            name: tuple((e.host, e.port) for e in p.engines.values())
            for name, p in self._pools.items()
        }

    def serving_targets(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """The serving engines per pool: whose metrics the pool's signals are read from."""
        return {
            name: tuple((e.host, e.port) for e in self.view(name).serving) for name in self._pools
        }

    # -- health -----------------------------------------------------------------------

    def probed(self, pool: str, address: str, answered: bool) -> EngineState | None:
        """One /health probe's result; the engine's state after it (None: unknown)."""
        engine = self.get(pool, address)
        if engine is None:
            return None
        health = self._health()
        if answered:
            engine.probes_failed = 0
            engine.probes_answered += 1
            if engine.probe_dead and engine.probes_answered >= health.healthy_after:
                engine.probe_dead = False
                self.version += 1
                engine.returns += 1
                engine.returned_at_s = self._clock()
                # Back (often a new process): judged on its answers from now on, not on
                # the failures of the requests that met it dead.
                engine.errors_in_row = 0
                if self._clock() >= engine.ejected_until_s:
                    engine.dead_reason = ""
        else:
            engine.probes_answered = 0
            engine.probes_failed += 1
            if engine.probes_failed >= health.unhealthy_after and not engine.probe_dead:
                engine.probe_dead = True
                engine.dead_reason = "probes"
                self.version += 1
        return engine.state(self._clock())

    def answered(self, pool: str, address: str, failed: bool) -> bool:
        """One request's answer from the engine (the access log's upstream host): a 5xx or
        a failed connection counts against it. True when this answer ejected it."""
        engine = self.get(pool, address)
        if engine is None:
            return False
        now_s = self._clock()
        engine.answered += 1
        if not failed:
            engine.errors_in_row = 0
            if now_s >= engine.ejected_until_s:
                engine.ejections_in_row = 0
            return False
        engine.failed += 1
        if engine.state(now_s) is EngineState.DEAD:
            return False  # already out: its failures while out prove nothing new
        engine.errors_in_row += 1
        health = self._health()
        if engine.errors_in_row < health.eject_after_errors:
            return False
        engines = self.engines(pool)
        out = sum(1 for e in engines if e.state(now_s) is EngineState.DEAD)
        if out + 1 > len(engines) // 2:
            return False  # at most half the pool ejected
        factor = min(MAX_EJECTION_FACTOR, 2**engine.ejections_in_row)
        engine.ejections_in_row += 1
        engine.ejected_until_s = now_s + health.eject_s * factor
        engine.errors_in_row = 0
        engine.dead_reason = "errors"
        self.version += 1
        return True

    def drain(self, address: str, draining: bool, pool: str | None = None) -> list[Engine]:
        """Drain (or undrain) the engine at `address` in every pool (or in `pool`)."""
        engines = [e for e in self.find(address) if pool is None or e.pool == pool]
        for engine in engines:
            engine.draining = draining
        self.version += 1
        return engines

    def state(self, engine: Engine) -> EngineState:
        return engine.state(self._clock())

    def serving(self, pool: str) -> list[Engine]:
        return list(self.view(pool).serving)

    def out(self, pool: str) -> frozenset[str]:
        """The pool's engines that take no new requests, or took none within the breaker's
        window, whose answers the breaker leaves out of the pool's signals (the failures
        that took an engine out stay in the window after it is back, and must not trip the
        pool then) — none while no engine serves: then the pool itself is failing, and its
        breaker must see it."""
        view = self.view(pool)
        engines = view.engines
        now_s = self._clock()
        if len(view.serving) == len(engines) and view.latest_out_s <= now_s - self._window_s():
            return frozenset()  # all serving, none out within the window (the usual case)
        out = frozenset(e.address for e in engines if e.state(now_s) is not EngineState.SERVING)
        if len(out) == len(engines):
            return frozenset()
        since_s = now_s - self._window_s()
        back = frozenset(
            e.address for e in engines if e.ejected_until_s > since_s or e.returned_at_s > since_s
        )
        # Every engine out now or lately: the ones out now, so that some answers still count.
        return out | back if len(out | back) < len(engines) else out

    def up_fraction(self, pool: str) -> float | None:
        """Serving engines / known engines; None: the pool has none known."""
        view = self.view(pool)
        return len(view.serving) / len(view.engines) if view.engines else None

    # -- metrics and capacity ---------------------------------------------------------

    def observe(self, pool: str, address: str, snapshot: EngineSnapshot) -> None:
        engine = self.get(pool, address)
        if engine is not None:
            engine.snapshot = snapshot
            engine.snapshot_at_s = self._clock()
            self.version += 1  # its reported KV size may have changed

    def kv_tokens(self, engine: Engine, spec: Pool) -> float | None:
        """The engine's KV cache in tokens: its own report, else its even share."""
        reported = engine.snapshot.kv_capacity_tokens if engine.snapshot is not None else None
        if reported:
            return float(reported)
        count = self.count(spec.name)
        if spec.kv_capacity_tokens is None or count == 0:
            return None
        return spec.kv_capacity_tokens / count

    def largest_kv_tokens(self, spec: Pool) -> float | None:
        """The KV cache of the pool's largest serving engine: a request whose footprint is
        larger runs on none of them (vLLM answers 400), however much the pool holds in all.
        None: unknown (no engine known or serving, or no size reported or configured)."""
        return self.sizes(self.view(spec.name), spec).largest_kv_tokens

    def sequences(self, spec: Pool) -> float | None:
        count = self.count(spec.name)
        if spec.max_num_seqs is None or count == 0:
            return None
        return spec.max_num_seqs / count

    def live_pool(self, spec: Pool) -> Pool:
        """`spec` with the capacity of its serving engines, plus what requests still hold
        on engines that take nothing new (a draining engine's requests run on; they were
        admitted against its room and free it when they end). A pool without engines known
        (not tracked), or with none serving, is `spec` itself."""
        view = self.view(spec.name)
        live = self.sizes(view, spec).live
        return live if live is not None else self._live_pool(view, spec)

    def _live_pool(self, view: PoolView, spec: Pool) -> Pool:
        engines = view.engines
        if not engines or (spec.kv_capacity_tokens is None and spec.max_num_seqs is None):
            return spec
        if not view.serving:
            return spec  # the whole pool is down: its breaker (L3 no_engines) decides
        now_s = self._clock()
        tokens = 0.0
        sequences = 0.0
        per_engine_seqs = self.sequences(spec) or 0.0
        for engine in engines:
            if engine.state(now_s) is EngineState.SERVING:
                tokens += self.kv_tokens(engine, spec) or 0.0
                sequences += per_engine_seqs
            else:
                tokens += engine.held_tokens
                sequences += engine.held_sequences
        return dataclasses.replace(
            spec,
            kv_capacity_tokens=None if spec.kv_capacity_tokens is None else math.floor(tokens),
            max_num_seqs=None if spec.max_num_seqs is None else math.floor(sequences),
        )

    def kv_usage(self, pool: str, stale_as_full: bool = True) -> float | None:
        """The pool's KV usage over its serving engines, weighted by their caches (one
        engine's report when capacities are unknown counts alike); a stale serving engine
        reads as full (the breaker's rule), or is left out (`stale_as_full` False: what the
        footprint ratio learns from, which one hung engine must not inflate for the whole
        pool); None without any reading."""
        now_s = self._clock()
        stale_s = self._stale_after_s()
        used = total = 0.0
        seen = False
        for engine in self.view(pool).serving:
            size = (engine.snapshot.kv_capacity_tokens if engine.snapshot else None) or 1.0
            snapshot = engine.fresh(now_s, stale_s)
            if snapshot is None:
                if engine.snapshot is None or not stale_as_full:
                    continue  # never read yet (or not counted): no data, not "full"
                usage = 1.0
            elif snapshot.kv_cache_usage is None:
                continue
            else:
                usage = snapshot.kv_cache_usage
            seen = True
            used += usage * size
            total += size
        return used / total if seen and total else None

    def fresh_kv_usage(self, pool: str) -> float | None:
        """`kv_usage` over the serving engines with fresh metrics only."""
        return self.kv_usage(pool, stale_as_full=False)

    # -- what this sidecar holds on each engine ---------------------------------------

    def hold(self, request_id: str, pool: str, address: str, tokens: int, sequences: int) -> None:
        engine = self.get(pool, address)
        if engine is None or request_id in self._held:
            return
        engine.held_tokens += tokens
        engine.held_sequences += sequences
        engine.picked += 1
        self._held[request_id] = HeldOn(pool, address, tokens, sequences)

    def release(self, request_id: str) -> HeldOn | None:
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        engine = self.get(held.pool, held.address)
        if engine is not None:
            engine.held_tokens -= held.tokens
            engine.held_sequences -= held.sequences
        return held

    def move(self, request_id: str, address: str) -> Engine | None:
        """Another engine of the request's pool served it (a fallback, after the first
        refused): its hold moves there. The engine it moved to; None when nothing moved
        (no hold, the same engine, or an address the pool does not have)."""
        held = self._held.get(request_id)
        if held is None or held.address == address:
            return None
        target = self.get(held.pool, address)
        if target is None:
            return None
        first = self.get(held.pool, held.address)
        if first is not None:
            first.held_tokens -= held.tokens
            first.held_sequences -= held.sequences
        target.held_tokens += held.tokens
        target.held_sequences += held.sequences
        self._held[request_id] = HeldOn(held.pool, address, held.tokens, held.sequences)
        return target

    @property
    def holds(self) -> int:
        return len(self._held)

    def table(self) -> Mapping[str, list[Engine]]:
        return {name: self.engines(name) for name in self._pools}
