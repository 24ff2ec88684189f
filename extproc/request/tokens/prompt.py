"""How many tokens a prompt holds: the count routing, the model maximum, KV admission and
budgets decide on.

What lives here: `CountKind`, `PromptCount` and `PromptCounter`, which applies the rule:

- Every message is counted exactly, with DeepSeek's own vocabulary (`extproc.request.tokens.bpe`),
  plus `per_message_overhead_tokens` for the chat template around it. A message seen
  before (chats resend their whole history) is not counted again: counts are kept by the
  digest of the text (extproc.request.tokens.digest), so a turn costs only its new message.
- Uncounted text up to `inline_max_bytes` (mostly ASCII) or `inline_unicode_max_bytes`
  (other text, whose worst case costs ~5x more per byte), capped by the engine's
  `inline_cap_bytes`, is counted on the event loop: on fastokens the hop to a thread cost
  more than the count (bench/results/overhead-levers-fastokens). More goes to `workers`
  threads (the BPE releases the GIL); on tiktoken a text of `split_min_bytes` or more is
  cut into one piece per worker where its counts add up, so they count it at once.
- When text cannot be counted (more than `max_bytes`, or more than `queue_max_bytes`
  already waiting), its UTF-8 length decides: byte-level BPE never yields more tokens
  than bytes, so that count is never below the real one. Decisions taken on it are the
  safe ones: route long, admit the larger footprint, refuse at the model maximum.

The bound this gives: the count is never below the real DeepSeek count of the message texts
(it is that count, or above it); what the engine adds around them (its chat template) is
`per_message_overhead_tokens` per message, and a key whose settled prompts keep exceeding
its counts gets its counts corrected (`extproc.request.tokens.corrections`). The fitted estimate is
not trusted for any decision: crafted text fools it tenfold (bench/results/estimator_accuracy).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from admission.decision import CountKind
from engines.prefix import text_blocks
from extproc.request.tokens.digest import utf8_key
from policy.schema import CountingConfig


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


@runtime_checkable
class CappedCounter(TokenCounter, Protocol):
    """A counter too slow per byte for long texts on the event loop (DeepSeekBpe)."""

    inline_cap_bytes: int


@runtime_checkable
class IdCounter(TokenCounter, Protocol):
    """A counter that also gives the ids it counted (FastokensBpe, DeepSeekBpe)."""

    def token_ids(self, text: str) -> np.ndarray: ...


@runtime_checkable
class SplittingCounter(TokenCounter, Protocol):
    """A counter that can cut a text where its counts add up (DeepSeekBpe.pieces)."""

    def pieces(self, text: str, parts: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int
    kind: CountKind
    # Asked for (`block_tokens`) and counted exactly: each text's running block hashes
    # (engines.prefix.text_blocks) and its token count, in the texts' order.
    blocks: tuple[np.ndarray, ...] | None = field(default=None, repr=False)
    lengths: tuple[int, ...] | None = None

    @property
    def exact(self) -> bool:
        return self.kind.exact


# Messages shorter than this are counted again rather than cached: cheaper than the lookup
# churn, and a short message is most of what a chat's history is not.
_CACHED_MIN_BYTES = 256
# The cached messages' block hashes together stay under this (8 bytes per block of ids).
BLOCK_CACHE_BYTES = 64 * 1024 * 1024

# One text's count and, when asked for, its block hashes.
_Counted = tuple[int, np.ndarray | None]


class PromptCounter:
    def __init__(
        self,
        counter: TokenCounter | None,
        config: CountingConfig,
        executor: Executor | None = None,
    ) -> None:
        self._counter = counter  # None: no tokenizer, the byte bound decides every count
        self._inline_cap = _inline_cap(counter)
        # Decided once: an isinstance check on a runtime protocol costs microseconds.
        self._gives_ids = isinstance(counter, IdCounter)
        self._config = config
        self._executor = executor
        self._cache: OrderedDict[bytes, _Counted] = OrderedDict()
        self._cache_block_bytes = 0
        self.queued_bytes = 0  # text waiting for a worker, or being counted
        # Told (text, its cache key or None, ids) of each text counted with ids: the
        # engine's templated ids then need not tokenize it again
        # (extproc.request.tokens.templated).
        self.ids_to: Callable[[str, bytes | None, np.ndarray], None] | None = None

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    @property
    def id_counter(self) -> IdCounter | None:
        """The exact counter, where it gives token ids (what templated ids are built with
        when a pool names no tokenizer of its own)."""
        return self._counter if self._gives_ids else None  # type: ignore[return-value]

    def use(self, counter: TokenCounter) -> None:
        """Count with `counter` from now on (the sidecar loads it after start-up begins)."""
        self._counter = counter
        self._inline_cap = _inline_cap(counter)
        self._gives_ids = isinstance(counter, IdCounter)

    async def count(
        self, texts: Sequence[str], token_ids: int = 0, block_tokens: int = 0
    ) -> PromptCount:
        """The prompt's count; with `block_tokens`, also each text's block hashes (when the
        counter gives ids and the count is exact: a bound has no ids); `ids_to`, where set,
        is told the ids of each text counted now."""
        config = self._config
        total = token_ids + config.per_message_overhead_tokens * len(texts)
        blocks_wanted = block_tokens > 0 and self._gives_ids
        known_counts: list[_Counted | None] = []
        pending: list[tuple[int, bytes | None, str, int]] = []  # (index, key, text, bytes)
        pending_bytes = 0
        for index, text in enumerate(texts):
            size, key = utf8_key(text, _CACHED_MIN_BYTES)
            if key is not None:
                known = self._cache.get(key)
                if known is not None and (known[1] is not None or not blocks_wanted):
                    self._cache.move_to_end(key)
                    total += known[0]
                    known_counts.append(known)
                    continue
            known_counts.append(None)
            pending.append((index, key, text, size))
            pending_bytes += size
        if not pending:
            return self._result(total, CountKind.CACHED, known_counts, block_tokens)
        if self._counter is None or pending_bytes > config.max_bytes:
            return PromptCount(total + pending_bytes, CountKind.BOUND)
        width = block_tokens if blocks_wanted else 0
        if pending_bytes <= self._inline_limit(pending, pending_bytes) or self._executor is None:
            with_ids = [_count_one(self._counter, text, width) for _, _, text, _ in pending]
        elif self.queued_bytes + pending_bytes > config.queue_max_bytes:
            return PromptCount(total + pending_bytes, CountKind.BUSY)
        else:
            with_ids = await self._count_off_loop(
                [text for _, _, text, _ in pending],
                [size for _, _, _, size in pending],
                self._config.workers,
                width,
            )
        counts = [counted for counted, _ in with_ids]
        ids_to = self.ids_to
        if ids_to is not None:
            for (_, key, text, _), (_, ids) in zip(pending, with_ids, strict=True):
                if ids is not None:
                    ids_to(text, key, ids)
        for (index, cache_key, _, _), counted in zip(pending, counts, strict=True):
            total += counted[0]
            known_counts[index] = counted
            if cache_key is not None:
                self._remember(cache_key, counted)
        return self._result(total, CountKind.EXACT, known_counts, width)

    @staticmethod
    def _result(
        total: int, kind: CountKind, counted: list[_Counted | None], block_tokens: int
    ) -> PromptCount:
        if not block_tokens:
            return PromptCount(total, kind)
        blocks = []
        lengths = []
        for item in counted:
            if item is None or item[1] is None:
                return PromptCount(total, kind)
            lengths.append(item[0])
            blocks.append(item[1])
        return PromptCount(total, kind, tuple(blocks), tuple(lengths))

    def _inline_limit(self, pending: list[tuple[int, bytes | None, str, int]], size: int) -> int:
        """Mostly-ASCII text (at most one byte in ten beyond one per character: English with
        its curly quotes and dashes) may be long on the loop; text of many multi-byte
        characters (CJK, emoji: the ones that cost most per byte) only short. `size`: the
        pending texts' UTF-8 bytes."""
        config = self._config
        chars = sum(len(text) for _, _, text, _ in pending)
        mostly_ascii = size * 10 <= chars * 11
        limit = config.inline_max_bytes if mostly_ascii else config.inline_unicode_max_bytes
        return min(limit, self._inline_cap)

    async def _count_off_loop(
        self, texts: list[str], sizes: list[int], workers: int, block_tokens: int = 0
    ) -> list[tuple[_Counted, np.ndarray | None]]:
        """Each text's count (and block hashes), from the worker threads. Texts of
        `split_min_bytes` or more are cut into one piece per worker, and the pieces dealt
        out so every worker counts about as many bytes, all at once: a long prompt's count
        takes its share of the workers' time instead of one worker's (the BPE releases the
        GIL). A cut text's ids are joined back in order before they are hashed."""
        counter = self._counter
        assert counter is not None
        split_at = self._config.split_min_bytes
        jobs: list[tuple[int, str]] = []  # (which text, piece), pieces in order
        for index, (text, size) in enumerate(zip(texts, sizes, strict=True)):
            if split_at and size >= split_at and isinstance(counter, SplittingCounter):
                jobs += [(index, piece) for piece in counter.pieces(text, workers)]
            else:
                jobs.append((index, text))
        bins: list[list[int]] = [[] for _ in range(min(workers, len(jobs)))]
        loads = [0] * len(bins)
        for job in sorted(range(len(jobs)), key=lambda j: -len(jobs[j][1])):
            lightest = loads.index(min(loads))
            bins[lightest].append(job)
            loads[lightest] += len(jobs[job][1])
        size_bytes = sum(sizes)
        self.queued_bytes += size_bytes
        ids = bool(block_tokens)
        try:
            loop = asyncio.get_running_loop()
            done = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        self._executor, _count_all, counter, [jobs[j][1] for j in b], ids
                    )
                    for b in bins
                )
            )
        finally:
            self.queued_bytes -= size_bytes
        results: list[int | np.ndarray] = [0] * len(jobs)
        for b, got in zip(bins, done, strict=True):
            for job, value in zip(b, got, strict=True):
                results[job] = value
        if not ids:
            counts = [0] * len(texts)
            for (index, _), value in zip(jobs, results, strict=True):
                counts[index] += int(value)
            return [((n, None), None) for n in counts]
        parts: list[list[np.ndarray]] = [[] for _ in texts]
        for (index, _), value in zip(jobs, results, strict=True):
            parts[index].append(value)  # type: ignore[arg-type]
        joined = [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]
        return [((int(a.shape[0]), text_blocks(a, block_tokens)), a) for a in joined]

    def _remember(self, key: bytes, counted: _Counted) -> None:
        old = self._cache.pop(key, None)
        if old is not None and old[1] is not None:
            self._cache_block_bytes -= old[1].nbytes
        self._cache[key] = counted
        if counted[1] is not None:
            self._cache_block_bytes += counted[1].nbytes
        while (
            len(self._cache) > self._config.cache_entries
            or self._cache_block_bytes > BLOCK_CACHE_BYTES
        ):
            _, dropped = self._cache.popitem(last=False)
            if dropped[1] is not None:
                self._cache_block_bytes -= dropped[1].nbytes


def _inline_cap(counter: TokenCounter | None) -> int:
    return counter.inline_cap_bytes if isinstance(counter, CappedCounter) else 1 << 62


def _count_one(
    counter: TokenCounter, text: str, block_tokens: int
) -> tuple[_Counted, np.ndarray | None]:
    """One text's count, and its block hashes when `block_tokens` (an IdCounter then); and
    the ids they came from."""
    if not block_tokens:
        return (counter.count(text), None), None
    ids = counter.token_ids(text)  # type: ignore[attr-defined]
    return (int(ids.shape[0]), text_blocks(ids, block_tokens)), ids


def _count_all(counter: TokenCounter, pieces: list[str], ids: bool) -> list[int | np.ndarray]:
    if ids:
        return [counter.token_ids(piece) for piece in pieces]  # type: ignore[attr-defined]
    return [counter.count(piece) for piece in pieces]
