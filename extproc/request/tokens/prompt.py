"""How many tokens a prompt holds: the count routing, the model maximum, KV admission and
budgets decide on.

What lives here: `CountKind`, `PromptCount` and `PromptCounter`, which applies the rule:

- Every message is counted exactly, with DeepSeek's own vocabulary (`extproc.request.tokens.bpe`),
  plus `per_message_overhead_tokens` for the chat template around it. A message seen
  before (chats resend their whole history) is not counted again: counts are kept by the
  BLAKE2b hash of the text, so a turn costs only its new message.
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
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from admission.decision import CountKind
from policy import CountingConfig


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


@runtime_checkable
class CappedCounter(TokenCounter, Protocol):
    """A counter too slow per byte for long texts on the event loop (DeepSeekBpe)."""

    inline_cap_bytes: int


@runtime_checkable
class SplittingCounter(TokenCounter, Protocol):
    """A counter that can cut a text where its counts add up (DeepSeekBpe.pieces)."""

    def pieces(self, text: str, parts: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int
    kind: CountKind

    @property
    def exact(self) -> bool:
        return self.kind.exact


# Messages shorter than this are counted again rather than cached: cheaper than the lookup
# churn, and a short message is most of what a chat's history is not.
_CACHED_MIN_BYTES = 256


class PromptCounter:
    def __init__(
        self,
        counter: TokenCounter | None,
        config: CountingConfig,
        executor: Executor | None = None,
    ) -> None:
        self._counter = counter  # None: no tokenizer, the byte bound decides every count
        self._inline_cap = _inline_cap(counter)
        self._config = config
        self._executor = executor
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self.queued_bytes = 0  # text waiting for a worker, or being counted

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def use(self, counter: TokenCounter) -> None:
        """Count with `counter` from now on (the sidecar loads it after start-up begins)."""
        self._counter = counter
        self._inline_cap = _inline_cap(counter)

    async def count(self, texts: Sequence[str], token_ids: int = 0) -> PromptCount:
        config = self._config
        total = token_ids + config.per_message_overhead_tokens * len(texts)
        pending: list[tuple[bytes | None, str, int]] = []  # (cache key, text, UTF-8 bytes)
        pending_bytes = 0
        for text in texts:
            raw = text.encode("utf-8", "surrogatepass")
            if len(raw) < _CACHED_MIN_BYTES:
                pending.append((None, text, len(raw)))
                pending_bytes += len(raw)
                continue
            key = hashlib.blake2b(raw, digest_size=16).digest()
            known = self._cache.get(key)
            if known is None:
                pending.append((key, text, len(raw)))
                pending_bytes += len(raw)
            else:
                self._cache.move_to_end(key)
                total += known
        if not pending:
            return PromptCount(total, CountKind.CACHED)
        if self._counter is None or pending_bytes > config.max_bytes:
            return PromptCount(total + pending_bytes, CountKind.BOUND)
        if pending_bytes <= self._inline_limit(pending, pending_bytes) or self._executor is None:
            counts = [self._counter.count(text) for _, text, _ in pending]
        elif self.queued_bytes + pending_bytes > config.queue_max_bytes:
            return PromptCount(total + pending_bytes, CountKind.BUSY)
        else:
            counts = await self._count_off_loop(
                [text for _, text, _ in pending],
                [size for _, _, size in pending],
                self._config.workers,
            )
        for (cache_key, _, _), count in zip(pending, counts, strict=True):
            total += count
            if cache_key is not None:
                self._remember(cache_key, count)
        return PromptCount(total, CountKind.EXACT)

    def _inline_limit(self, pending: list[tuple[bytes | None, str, int]], size: int) -> int:
        """Mostly-ASCII text (at most one byte in ten beyond one per character: English with
        its curly quotes and dashes) may be long on the loop; text of many multi-byte
        characters (CJK, emoji: the ones that cost most per byte) only short. `size`: the
        pending texts' UTF-8 bytes."""
        config = self._config
        chars = sum(len(text) for _, text, _ in pending)
        mostly_ascii = size * 10 <= chars * 11
        limit = config.inline_max_bytes if mostly_ascii else config.inline_unicode_max_bytes
        return min(limit, self._inline_cap)

    async def _count_off_loop(self, texts: list[str], sizes: list[int], workers: int) -> list[int]:
        """Each text's count, from the worker threads. Texts of `split_min_bytes` or more
        are cut into one piece per worker, and the pieces dealt out so every worker counts
        about as many bytes, all at once: a long prompt's count takes its share of the
        workers' time instead of one worker's (the BPE releases the GIL)."""
        counter = self._counter
        assert counter is not None
        split_at = self._config.split_min_bytes
        jobs: list[tuple[int, str]] = []  # (which text, piece)
        for index, (text, size) in enumerate(zip(texts, sizes, strict=True)):
            if split_at and size >= split_at and isinstance(counter, SplittingCounter):
                jobs += [(index, piece) for piece in counter.pieces(text, workers)]
            else:
                jobs.append((index, text))
        bins: list[list[tuple[int, str]]] = [[] for _ in range(min(workers, len(jobs)))]
        loads = [0] * len(bins)
        for job in sorted(jobs, key=lambda j: -len(j[1])):
            lightest = loads.index(min(loads))
            bins[lightest].append(job)
            loads[lightest] += len(job[1])
        size_bytes = sum(sizes)
        self.queued_bytes += size_bytes
        try:
            loop = asyncio.get_running_loop()
            done = await asyncio.gather(
                *(loop.run_in_executor(self._executor, _count_all, counter, b) for b in bins)
            )
        finally:
            self.queued_bytes -= size_bytes
        counts = [0] * len(texts)
        for b, got in zip(bins, done, strict=True):
            for (index, _), n in zip(b, got, strict=True):
                counts[index] += n
        return counts

    def _remember(self, key: bytes, count: int) -> None:
        self._cache[key] = count
        if len(self._cache) > self._config.cache_entries:
            self._cache.popitem(last=False)


def _inline_cap(counter: TokenCounter | None) -> int:
    return counter.inline_cap_bytes if isinstance(counter, CappedCounter) else 1 << 62


def _count_all(counter: TokenCounter, jobs: list[tuple[int, str]]) -> list[int]:
    return [counter.count(piece) for _, piece in jobs]
