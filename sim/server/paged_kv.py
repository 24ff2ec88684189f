"""An engine's KV cache in blocks, with vLLM's automatic prefix caching. Pure.

What lives here: `PagedKvCache`, a `KvCache` that counts in blocks of `block_size` tokens
and keeps a prefix cache in them, as vLLM does, and `PromptPlan`, what it is told of a
request before it is submitted (the block hashes of its prompt's full blocks, their token
ids, and the tokens it will hold past them).

The model, vLLM's: a running request holds its prompt's full blocks (shared: a block
another running request holds, or one still cached from an earlier prompt, is not stored
twice) and blocks of its own for its last partial prompt block and what it generates.
When it ends its prompt blocks stay cached, evictable: they live in free KV until a
request needs the room, least recently used first out (a prompt's deepest blocks first,
as vLLM frees a request's blocks tail first). So the prefix cache is bounded by the KV
itself, and running requests push it out. A prompt's hit is its longest run of leading
blocks cached. KV usage counts the blocks running requests hold, as vLLM's
`kv_cache_usage_perc` does (cached, evictable blocks read as free).

What it stores, evicts and clears it appends to `events` as vLLM's KV events
(`BlockStored` / `BlockRemoved` / `AllBlocksCleared`, engines.kv_events) for whoever
publishes them (the offline fleet to its sidecars' pickers; the simulated engine server
on ZMQ) to take with `drain_events`. Only prompt blocks are cached (vLLM also caches the
full blocks of what it generates: a later turn's prompt that resends an answer would hit
more there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from sim.server.model import EngineAdmission, KvCache


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """One request as the engine will hold it: its prompt's full blocks (hash, chained from
    the prompt's start, and their token ids, `block_size` a block) and the tokens it holds
    past them (its last partial prompt block and its output)."""

    hashes: tuple[int, ...]
    token_ids: Sequence[int]
    own_tokens: int


class PagedKvCache(KvCache):
    def __init__(
        self,
        capacity_tokens: int,
        block_size: int,
        *,
        max_running: int = 256,
        max_queue: int = 256,
        overcommit_ratio: float = 1.0,
    ) -> None:
        super().__init__(
            capacity_tokens,
            max_running=max_running,
            max_queue=max_queue,
            overcommit_ratio=overcommit_ratio,
        )
        if block_size <= 0:
            raise ValueError("block_size must be > 0")
        self.block_size = block_size
        self.blocks = capacity_tokens // block_size
        self._limit = int(self.blocks * overcommit_ratio)
        self._plans: dict[str, PromptPlan] = {}
        self._hits: dict[str, int] = {}  # running request -> its prompt's cached tokens
        self._held: dict[int, int] = {}  # block hash -> running requests holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._own_blocks = 0  # running requests' blocks of their own (not cached)
        self.events: list[KvEvent] = []

    @property
    def cached_blocks(self) -> int:
        """Blocks its prefix cache holds: held by running requests, or evictable."""
        return len(self._held) + len(self._evictable)

    def plan(self, request_id: str, plan: PromptPlan) -> None:
        """What `request_id` will hold; told before it is submitted."""
        self._plans[request_id] = plan

    def hit_tokens(self, request_id: str) -> int:
        """The prompt tokens a running request found cached when it was admitted."""
        return self._hits.get(request_id, 0)

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """Leading blocks of these the cache holds (held or evictable)."""
        count = 0
        for digest in hashes:
            if digest not in self._held and digest not in self._evictable:
                break
            count += 1
        return count

    def _own(self, plan: PromptPlan) -> int:
        return -(-plan.own_tokens // self.block_size)

    def _too_large(self, request_id: str, kv_tokens: int) -> bool:
        plan = self._plans.get(request_id)
        if plan is None:
            return super()._too_large(request_id, kv_tokens)
        return len(plan.hashes) + self._own(plan) > self._limit

    def _fits(self, request_id: str, kv_tokens: int) -> bool:
        plan = self._plans.get(request_id)
        if plan is None:  # not planned: its weighted tokens as own blocks
            plan = PromptPlan((), (), kv_tokens)
        if len(self._running) >= self.max_running:
            return False
        new = self._own(plan)
        kept = 0  # evictable blocks it will hold: they cannot be evicted to make its room
        for digest in set(plan.hashes):
            if digest in self._evictable:
                kept += 1
            elif digest not in self._held:
                new += 1
        in_use = len(self._held) + self._own_blocks
        return in_use + kept + new <= self._limit

    def _take(self, request_id: str, kv_tokens: int) -> None:
        plan = self._plans.setdefault(request_id, PromptPlan((), (), kv_tokens))
        self._hits[request_id] = self.cached_prefix(plan.hashes) * self.block_size
        stored: list[int] = []
        first_stored = -1
        for position, digest in enumerate(plan.hashes):
            if digest in self._held:
                self._held[digest] += 1
                continue
            if digest in self._evictable:
                del self._evictable[digest]
            else:
                if not stored:
                    first_stored = position
                stored.append(digest)
            self._held[digest] = 1
        own = self._own(plan)
        self._own_blocks += own
        self._evict_beyond_capacity()
        if stored:
            size = self.block_size
            start = first_stored * size
            self.events.append(
                BlockStored(
                    block_hashes=tuple(stored),
                    parent_block_hash=plan.hashes[first_stored - 1] if first_stored else None,
                    token_ids=tuple(plan.token_ids[start : start + len(stored) * size]),
                    block_size=size,
                )
            )
        self._running[request_id] = (len(plan.hashes) + own) * self.block_size
        self.used_tokens = (len(self._held) + self._own_blocks) * self.block_size

    def _evict_beyond_capacity(self) -> None:
        room = self._limit - len(self._held) - self._own_blocks
        removed: list[int] = []
        while self._evictable and len(self._evictable) > max(room, 0):
            digest, _ = self._evictable.popitem(last=False)
            removed.append(digest)
        if removed:
            self.events.append(BlockRemoved(block_hashes=tuple(removed)))

    def _give_back(self, request_id: str) -> None:
        del self._running[request_id]
        self._hits.pop(request_id, None)
        plan = self._plans.pop(request_id)
        self._own_blocks -= self._own(plan)
        # Tail first into the least-recently-used end: a prompt's deepest blocks go first.
        for digest in reversed(plan.hashes):
            holders = self._held.get(digest)
            if holders is None:
                continue  # a block the prompt repeats: given back already
            if holders > 1:
                self._held[digest] = holders - 1
            else:
                del self._held[digest]
                self._evictable[digest] = None
        self.used_tokens = (len(self._held) + self._own_blocks) * self.block_size

    def submit(self, request_id: str, kv_tokens: int, priority: int = 0) -> EngineAdmission:
        admission = super().submit(request_id, kv_tokens, priority)
        if admission in (EngineAdmission.REJECTED_QUEUE_FULL, EngineAdmission.REJECTED_TOO_LARGE):
            self._plans.pop(request_id, None)  # refused: never released
        return admission

    def release(self, request_id: str) -> list[str]:
        if request_id not in self._running:
            self._plans.pop(request_id, None)  # it waited: nothing held
        return super().release(request_id)

    def clear(self) -> None:
        """Its cache emptied (a reset, or the engine started afresh): what is evictable goes,
        and it says so."""
        self._evictable.clear()
        self.events.append(AllBlocksCleared())

    def drain_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events
