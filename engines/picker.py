"""Picking one request's engine: the pool's serving engines as candidates, their scores,
and what the choice leaves behind (the hold on the engine, the prefix it now caches). Pure.

What lives here: `EnginePicker`, the one object the sidecar's request path and the
simulator both ask. It owns each pool's prefix index (engines.prefix) and reads the
engines' state from the fleet (engines.state); scoring itself is engines.scoring.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

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
        self._returns: dict[tuple[str, int], int] = {}  # (pool, slot) -> returns seen

    def picks(self, spec: Pool) -> bool:
        """Whether slogate names the engine of this pool's requests."""
        return spec.picker is Picker.SLOGATE and self.fleet.count(spec.name) > 0

    def wants_blocks(self, policy: Policy) -> bool:
        """Whether any pool picks among more than one engine: only then is a prompt's ids
        hashed into blocks (a few tens of microseconds)."""
        return any(
            spec.picker is Picker.SLOGATE and self.fleet.count(name) > 1
            for name, spec in policy.pools.items()
        )

    def index(self, pool: str) -> PrefixIndex:
        entries = self._policy().engines.picking.index_entries
        index = self.indexes.get(pool)
        if index is None:
            index = self.indexes[pool] = PrefixIndex(entries)
        index.entries = entries
        return index

    def candidates(self, spec: Pool, blocks: PromptBlocks) -> list[EngineCandidate]:
        """The pool's serving engines, each with what the scorers read."""
        fleet = self.fleet
        engines = fleet.serving(spec.name)
        index = self.index(spec.name)
        for engine in engines:  # came back from the dead: its prefix cache is empty
            seen = self._returns.get((spec.name, engine.slot), 0)
            if engine.returns != seen:
                index.forget(engine.slot)
                self._returns[(spec.name, engine.slot)] = engine.returns
        matched = index.matched_tokens(blocks, [e.slot for e in engines])
        now_s = self._clock()
        stale_s = self._stale_after_s()
        sequences = fleet.sequences(spec)
        candidates = []
        for engine, tokens in zip(engines, matched, strict=True):
            fresh = engine.fresh(now_s, stale_s)
            candidates.append(
                EngineCandidate(
                    address=engine.address,
                    slot=engine.slot,
                    held_tokens=engine.held_tokens,
                    held_sequences=engine.held_sequences,
                    kv_tokens=fleet.kv_tokens(engine, spec),
                    sequences=sequences,
                    scraped_kv_usage=None if fresh is None else fresh.kv_cache_usage,
                    matched_tokens=tokens,
                )
            )
        return candidates

    def pick(
        self,
        request_id: str,
        spec: Pool,
        blocks: PromptBlocks,
        bucket: str,
        tokens: int,
        sequences: int,
    ) -> tuple[str, ...]:
        """The engines for one admitted request, best first; the first holds its footprint
        and now caches its prefix. Empty: slogate does not pick here (Envoy balances)."""
        if not self.picks(spec):
            return ()
        config = self._policy().engines.picking
        if not blocks.key:
            # Not counted (a byte bound): no conversation to keep together; the request's own
            # id spreads such requests over the engines.
            blocks = dataclasses.replace(blocks, key=_id_key(request_id))
        # An engine whose KV cache is smaller than the request's footprint cannot run it
        # (KV admission refused it if none can: admission.kv.step).
        candidates = [
            c for c in self.candidates(spec, blocks) if c.kv_tokens is None or tokens <= c.kv_tokens
        ]
        chosen = pick(candidates, blocks, bucket, config)
        if not chosen:
            return ()
        engine = self.fleet.get(spec.name, chosen[0])
        if engine is not None:
            self.fleet.hold(request_id, spec.name, engine.address, tokens, sequences)
            if not blocks.empty:
                self.index(spec.name).add(blocks, engine.slot)
        return tuple(chosen)

    def fleet_policy(self) -> Policy:
        return self._policy()

    def release(self, request_id: str) -> None:
        self.fleet.release(request_id)


def _id_key(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
