"""DeepSeek's tokenizer on fastokens: the reference's own `tokenizer.json`, split by PCRE2 and
merged in Rust, 5-7x cheaper than tiktoken with the same vocabulary (`bpe`).

What lives here: `FastokensBpe`, the request path's counter, and `exact_counter`, which picks
the engine `counting.engine` names. Counting is most of the sidecar's CPU at the sizes users
send (bench/results/overhead-profile: BPE 61-63% of its samples on tiktoken), so the engine
is the lever that moves it.

Why it can be trusted to count what the model sees: it reads the very file the reference
loads (pre-tokenizer regexes, merges, added tokens), and
tests/extproc/request/tokens/test_tokens.py checks its ids against the reference on every
corpus, on tens of thousands of random strings from every Unicode plane,
and on every code point in several contexts. The last check is the one
that matters for an upgrade: tokenizers built on another regex engine (gigatok 0.2.0 was
tried) disagree with the reference on the ~4,800 code points newer Unicode versions
assigned, and an attacker can fill a prompt with them. fastokens is pinned for that reason.

Where it can fail: PCRE2 has match limits; text it refuses (an exception, never a wrong
count) is counted by tiktoken instead, whose regex engine has none.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.reference import default_tokenizer_path, encodable

log = logging.getLogger(__name__)


class FastokensBpe:
    """Counts DeepSeek tokens with fastokens. Built once (~1.3 s); thread-safe; releases the
    GIL while it counts, and spreads a text longer than ~64 KB over its own threads. So it
    offers no `pieces`: cutting a long text for the counting workers
    (`counting.split_min_bytes`, which pays on tiktoken) cost more than it gave here
    (bench/results/overhead: 32k p50 6.2-7.0 ms cut vs 4.5-5.5 whole, at the same or lower
    throughput)."""

    def __init__(self, tokenizer_path: Path | None = None) -> None:
        import fastokens

        self._path = tokenizer_path or default_tokenizer_path()
        self._tokenizer = fastokens.Tokenizer.from_file(str(self._path))
        # tiktoken is loaded only if fastokens ever refuses a text: no measured text did,
        # and loading it too added ~0.5 s to every start (1.75 s in the estimator bench)
        # and its tables to every worker's memory.
        self._fallback: DeepSeekBpe | None = None
        self._fallback_lock = threading.Lock()
        self.count("warm up: the first call compiles PCRE2's patterns")

    def count(self, text: str) -> int:
        if not text:
            return 0
        try:
            return len(self._tokenizer.encode(encodable(text), add_special_tokens=False))
        except Exception:  # a PCRE2 limit: counted by an engine that has none
            log.warning("fastokens refused a %d-character text; counted by tiktoken", len(text))
            return self._tiktoken().count(text)

    def token_ids(self, text: str) -> np.ndarray:
        """The ids as one uint32 array (no Python object per token: as cheap as a count);
        what the engine picker hashes into prefix blocks."""
        if not text:
            return np.zeros(0, dtype=np.uint32)
        try:
            flat, _ = self._tokenizer.encode_batch_flat([encodable(text)])
        except Exception:  # a PCRE2 limit: counted by an engine that has none
            log.warning("fastokens refused a %d-character text; counted by tiktoken", len(text))
            return self._tiktoken().token_ids(text)
        return np.frombuffer(flat, dtype=np.uint32)

    def _tiktoken(self) -> DeepSeekBpe:
        with self._fallback_lock:  # counting threads may fail at once: load it once
            if self._fallback is None:
                self._fallback = DeepSeekBpe(self._path)
            return self._fallback

    def ids(self, text: str) -> list[int]:
        """The reference tokenizer's ids for `text` (what the tests compare)."""
        return list(self._tokenizer.encode(encodable(text), add_special_tokens=False).ids)


def exact_counter(engine: str = "auto") -> FastokensBpe | DeepSeekBpe:
    """The counter `counting.engine` names; `auto` is fastokens where it imports (it is a
    dependency, but a platform without its wheel can run without it), tiktoken elsewhere."""
    if engine == "tiktoken":
        return DeepSeekBpe()
    if engine not in ("auto", "fastokens"):
        raise ValueError(f"no counting engine named {engine!r}")
    try:
        return FastokensBpe()
    except ImportError:
        if engine == "fastokens":
            raise
        log.warning("fastokens is not installed: prompts are counted by tiktoken (5-7x the CPU)")
        return DeepSeekBpe()
