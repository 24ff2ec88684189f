"""Picking one request's engine: the pool's serving engines as candidates, their scores,
and what the choice leaves behind (the hold on the engine, the prefix it now caches). Pure.

What lives here: `EnginePicker`, the one object the sidecar's request path and the
simulator both ask. It owns each pool's prefix index (engines.prefix) and, for pools whose
engines publish KV events, their exact index (engines.cached_blocks, fed through
`kv_events`); it reads the engines' state from the fleet (engines.state); scoring itself is
engines.scoring. An engine that publishes is scored from what it says it holds; one that
publishes nothing (or a prompt whose engine ids were not built) from the approximate index.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Collection, Sequence

from engines.cached_blocks import CachedBlocks, block_keys
from engines.engine import Engine
from engines.kv_events import EventBatch
from engines.pool_view import PoolView
from engines.prefix import PrefixIndex, PromptBlocks
from engines.scoring import EngineCandidate, pick
from engines.state import EngineFleet
from policy.domain import Picker, Pool
from policy.schema import Policy


class EnginePicker:
    def __init__(
        self,
        fleet: EngineFleet,
        policy: Callable[[], Policy],
        clock: Callable[[], float],
        stale_after_s: Callable[[], float] = lambda: 15.0,
    ) -> None:
        self.fleet = fleet
        self._policy = policy
        self._clock = clock
        self._stale_after_s = stale_after_s
        self.indexes: dict[str, PrefixIndex] = {}
        self.cached: dict[str, CachedBlocks] = {}  # pools whose engines published KV events
        self._returns: dict[tuple[str, int], int] = {}  # (pool, slot) -> returns seen
        # What each running request's prompt put in its pool's index: moved to the engine
        # that served it when a fallback did (`served`).
        self._blocks: dict[str, tuple[str, PromptBlocks]] = {}
        # Per pool, the fleet's view whose serving engines were last checked for a return
        # (`_returned`): the same view, the same engines and counts, nothing to check.
        self._checked: dict[str, PoolView] = {}
        # `wants_blocks`' last answer, and for which policy snapshot and fleet version.
        self._wants: tuple[Policy, int, bool] | None = None

    def picks(self, spec: Pool) -> bool:
        """Whether slogate names the engine of this pool's requests."""
        return spec.picker is Picker.SLOGATE and self.fleet.count(spec.name) > 0

    def wants_blocks(self, policy: Policy) -> bool:
        """Whether any pool picks among more than one engine: only then is a prompt's ids
        hashed into blocks (a few tens of microseconds)."""
        wants = self._wants
        version = self.fleet.version
        if wants is not None and wants[0] is policy and wants[1] == version:
            return wants[2]
        answer = any(
            spec.picker is Picker.SLOGATE and self.fleet.count(name) > 1
            for name, spec in policy.pools.items()
        )
        self._wants = (policy, version, answer)
        return answer

    def index(self, pool: str) -> PrefixIndex:
        return self._index(pool, self._policy().engines.picking.index_entries)

    def _index(self, pool: str, entries: int) -> PrefixIndex:
        index = self.indexes.get(pool)
        if index is None:
            index = self.indexes[pool] = PrefixIndex(entries)
        index.entries = entries
        return index

    def cached_blocks(self, pool: str) -> CachedBlocks:
        spec = self._policy().pools.get(pool)
        cap = spec.kv_events.max_blocks if spec is not None and spec.kv_events else 262_144
        cached = self.cached.get(pool)
        if cached is None:
            cached = self.cached[pool] = CachedBlocks(cap)
        cached.max_blocks = cap
        return cached

    def kv_events(self, pool: str, address: str, batch: EventBatch) -> None:
        """One batch of an engine's KV events (the sidecar's subscriber, the simulator's
        engines): its exact index follows."""
        engine = self.fleet.get(pool, address)
        if engine is None:
            return
        self._returned(pool, engine)
        self.cached_blocks(pool).apply(engine.slot, batch)

    def kv_events_lost(self, pool: str, address: str) -> None:
        """What the engine holds is unknown (a gap nobody replayed): from empty again."""
        engine = self.fleet.get(pool, address)
        cached = self.cached.get(pool)
        if engine is not None and cached is not None:
            cached.clear(engine.slot)

    def _returned(self, pool: str, engine: Engine) -> None:
        """Came back from the dead: its prefix cache is empty."""
        seen = self._returns.get((pool, engine.slot), 0)
        if engine.returns != seen:
            self.index(pool).forget(engine.slot)
            cached = self.cached.get(pool)
            if cached is not None:
                cached.forget(engine.slot)
            self._returns[(pool, engine.slot)] = engine.returns

    def candidates(
        self, spec: Pool, blocks: PromptBlocks, within: Collection[str] | None = None
    ) -> list[EngineCandidate]:
        """The pool's serving engines (only those `within`, when given: a gateway's subset
        hint), each with what the scorers read."""
        return self._candidates(spec, blocks, within, self.index(spec.name))

    def _candidates(
        self, spec: Pool, blocks: PromptBlocks, within: Collection[str] | None, index: PrefixIndex
    ) -> list[EngineCandidate]:
        fleet = self.fleet
        view = fleet.view(spec.name)
        sizes = fleet.sizes(view, spec)
        engines: Sequence[Engine] = view.serving
        kv_tokens: Sequence[float | None] = sizes.kv_tokens
        if self._checked.get(spec.name) is not view:
            for engine in engines:
                self._returned(spec.name, engine)
            self._checked[spec.name] = view
        if within is not None:
            kept = [i for i, e in enumerate(engines) if e.address in within]
            engines = [engines[i] for i in kept]
            kv_tokens = [kv_tokens[i] for i in kept]
        slots = [e.slot for e in engines]
        matched = index.matched_tokens(blocks, slots)
        exact = self._exact(spec.name, blocks, slots, matched)
        # Fresh metrics only (Engine.fresh, inlined: one call less per engine per request).
        now_s = self._clock()
        stale_s = self._stale_after_s()
        sequences = sizes.sequences
        # Positional: keywords are matched to the parameters by name on every call (~1 us
        # more per engine per request).
        return [
            EngineCandidate(
                engine.address,
                engine.slot,
                engine.held_tokens,
                engine.held_sequences,
                kv,
                sequences,
                engine.snapshot.kv_cache_usage
                if engine.snapshot is not None and now_s - engine.snapshot_at_s <= stale_s
                else None,
                tokens,
                engine.slot in exact,
            )
            for engine, kv, tokens in zip(engines, kv_tokens, matched, strict=True)
        ]

    def _exact(
        self, pool: str, blocks: PromptBlocks, slots: list[int], matched: list[int]
    ) -> frozenset[int]:
        """Overwrite `matched` from the exact index for the engines that publish; their
        slots. Exact matches are in the engine's templated tokens, scaled to the prompt's
        counted tokens, which the scorer's shares are of."""
        cached = self.cached.get(pool)
        ids = blocks.engine_ids
        if cached is None or ids is None or not cached.block_size or not len(ids):
            return frozenset()
        publishing = [i for i, slot in enumerate(slots) if cached.publishes(slot)]
        if not publishing:
            return frozenset()
        exact = cached.matched_tokens(block_keys(ids, cached.block_size), slots)
        scale = blocks.total_tokens / len(ids) if blocks.total_tokens else 1.0
        for i in publishing:
            matched[i] = round(exact[i] * scale)
        return frozenset(slots[i] for i in publishing)

    def pick(
        self,
        request_id: str,
        spec: Pool,
        blocks: PromptBlocks,
        bucket: str,
        tokens: int,
        sequences: int,
        within: Collection[str] | None = None,
    ) -> tuple[str, ...]:
        """The engines for one admitted request, best first; the first holds its footprint
        and now caches its prefix. `within`: the only endpoints a gateway allows (its subset
        hint). Empty: slogate does not pick here (Envoy balances), or nothing `within` can
        serve (see `eligible`)."""
        if not self.picks(spec):
            return ()
        config = self._policy().engines.picking
        if not blocks.key:
            # Not counted (a byte bound): no conversation to keep together; the request's own
            # id spreads such requests over the engines.
            blocks = dataclasses.replace(blocks, key=_id_key(request_id))
        # An engine whose KV cache is smaller than the request's footprint cannot run it
        # (KV admission refused it if none can: admission.kv.step).
        index = self._index(spec.name, config.index_entries)
        candidates = [
            c
            for c in self._candidates(spec, blocks, within, index)
            if c.kv_tokens is None or tokens <= c.kv_tokens
        ]
        chosen = pick(candidates, blocks, bucket, config)
        if not chosen:
            return ()
        for first in candidates:  # the first choice: one of the pool's serving engines
            if first.address == chosen[0]:
                break
        self.fleet.hold(request_id, spec.name, first.address, tokens, sequences)
        if blocks.hashes:
            index.add(blocks, first.slot)
            # Without the engine's ids (4 bytes a token): only the ladder moves.
            kept = blocks
            if blocks.engine_ids is not None:
                kept = dataclasses.replace(blocks, engine_ids=None)
            self._blocks[request_id] = (spec.name, kept)
        return tuple(chosen)

    def eligible(self, spec: Pool, within: Collection[str]) -> bool:
        """Whether any serving engine of the pool is among `within` (a subset hint)."""
        return any(e.address in within for e in self.fleet.view(spec.name).serving)

    def served(self, request_id: str, address: str) -> None:
        """The engine that served the request (the gateway's or the access log's word): when
        a fallback served instead of the first named, the request's hold and its prompt's
        prefix move there. (The first engine's index keeps the prefix until it ages out.)"""
        engine = self.fleet.move(request_id, address)
        remembered = self._blocks.get(request_id)
        if engine is not None and remembered is not None:
            pool, blocks = remembered
            self.index(pool).add(blocks, engine.slot)

    def fleet_policy(self) -> Policy:
        return self._policy()

    def release(self, request_id: str) -> None:
        self.fleet.release(request_id)
        self._blocks.pop(request_id, None)


def _id_key(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
