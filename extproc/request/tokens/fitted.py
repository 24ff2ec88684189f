"""The fitted byte-class estimate of a text's DeepSeek token count, and its cheap bound.

What lives here: `fast_estimate` (numpy, O(bytes), a few percent high on the natural text
it was fitted on) and `upper_estimate` (never below it). The request path no longer
decides on them: text without natural word structure (random letters, base64, rare
ideographs) is estimated up to 10x low (bench/results/estimator_accuracy.md, the hostile
corpus), so every count that matters is exact (`extproc.request.tokens.prompt`). They stay for the
accuracy benchmark, which shows why.

The coefficients below come from `python -m tooling.benchmarks.estimator --fit`; change
them only together with a fresh `bench/results/estimator_accuracy.*`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    pass

__all__ = ["TextFeatures", "fast_estimate", "text_features", "upper_estimate"]

# --- the fast estimate -------------------------------------------------------------------
#
# DeepSeek's pre-tokenizer splits text into letter runs (with their leading space), digit
# groups of 1-3, punctuation runs, whitespace runs and CJK runs, then BPE merges inside each
# piece. So the token count follows a few byte classes of the UTF-8 text, all of which numpy
# counts with vectorised compares (no Python loop over characters):
#   letters           ASCII letters.
#   symbol_starts     other ASCII bytes (space, digit, punctuation, newline) that differ from
#                     the byte before: nearly every one begins a new token.
#   symbol_repeats    the same symbol again (indentation, "-----", "====="): BPE swallows runs
#                     whole. Counting them apart from symbol_starts is what makes source code
#                     and ASCII tables come out right (a third less error on code).
#   non-ASCII bytes   split by script: Simplified Chinese costs ~0.55 tokens per ideograph,
#                     Traditional ~0.70 (the vocabulary saw more Simplified text). Both use the
#                     same code points, so `_traditional_share` looks, in a small window, for
#                     frequent characters that exist in one script only.
#
# Fit: least squares on relative error (each language and each sample size weighted equally),
# coefficients kept >= 0, then scaled up until no language is under-estimated on average on
# the fit half of the corpus: an over-estimate only makes a request look a little more
# expensive, an under-estimate lets it past a limit. Reproduce with
# `python -m tooling.benchmarks.estimator --fit`; accuracy is in
# bench/results/estimator_accuracy.md. Because every coefficient is >= 0 and a byte's class
# depends only on itself and the byte before, appending text never lowers the estimate (the
# one exception: the Simplified/Traditional share of the first ~1000 CJK characters).
TOKENS_PER_LETTER = 0.0626  # "model " = 5 letters + 1 space = 0.31 + 0.91 = 1.2 tokens
TOKENS_PER_SYMBOL_START = 0.9133
TOKENS_PER_SYMBOL_REPEAT = 0.0  # the fit puts a whole run's cost on its first byte
TOKENS_PER_SIMPLIFIED_BYTE = 0.2097  # x3 bytes = 0.63 tokens per ideograph or CJK punctuation
TOKENS_PER_TRADITIONAL_BYTE = 0.2442  # x3 bytes = 0.73 tokens per ideograph

# Strings are measured in slices so that the temporary numpy arrays stay cache-sized and get
# reused by malloc, instead of touching fresh pages for every multi-megabyte prompt.
_SLICE_CHARS = 1 << 18

# Script detection: frequent 64-code-point blocks that occur in one Chinese script only.
# Simplified: 讠 speech radical U+8BC0-8BFF (说 语 请 该 话 读 调 …) and 纟 silk radical
# U+7EC0-7EFF (经 给 结 统 续 …). Traditional: 言 speech radical U+8A40-8ABF (語 說 誰 課 調 認
# 記 設 許 話 該 詞 試 …) and 門 door radical U+9580-95BF (開 間 門 閱 …). On the benchmark
# corpus they are ~2.7% of Simplified and ~1.8% of Traditional ideographs, and neither set
# occurs in the other script's text, so single-script text gets a share of exactly 0 or 1.
_SIMPLIFIED_BLOCKS = (0x8BC0 >> 6, 0x7EC0 >> 6)
_TRADITIONAL_BLOCKS = (0x8A40 >> 6, 0x8A80 >> 6, 0x9580 >> 6)
# ~1000 characters from the first non-ASCII one hold ~20 markers of either script; a window
# keeps the check at a few µs however long the message is.
_SCRIPT_WINDOW_CHARS = 1024


class TextFeatures(NamedTuple):
    """Byte-class counts of one text's UTF-8 encoding; the inputs of `fast_estimate`."""

    letters: int
    symbol_starts: int
    symbol_repeats: int
    simplified_bytes: float  # non-ASCII UTF-8 bytes charged at the Simplified Chinese rate
    traditional_bytes: float  # non-ASCII UTF-8 bytes charged at the Traditional Chinese rate


def text_features(text: str) -> TextFeatures:
    """Count the byte classes `fast_estimate` is built on. O(length), all in numpy / C.

    The classes are defined on UTF-8 bytes (what the tokenizer sees) but counted on UTF-16
    code units, because CPython encodes a str to UTF-16 3-4x faster than to UTF-8 and every
    count has a UTF-16 twin: ASCII is ASCII, a unit >= 0x80 is 2 UTF-8 bytes and one >= 0x800
    is 3. The one difference: a character outside the BMP (emoji) counts 6 bytes instead of
    4, which nudges emoji, under-estimated otherwise, the right way.
    """
    letters = symbol_repeats = high_units = wide_units = total = 0
    previous_unit = -1  # last unit of the previous slice, to see runs across slices
    # The script window: _SCRIPT_WINDOW_CHARS units from the first non-ASCII one, possibly
    # spread over two slices; -1 until it starts.
    window_parts: list[np.ndarray] = []
    window_left = -1
    ascii_only = text.isascii()  # O(1): CPython keeps the flag
    for start in range(0, len(text), _SLICE_CHARS):
        piece = text[start : start + _SLICE_CHARS]
        # A slice gets the narrowest representation that fits it, so English with a stray
        # curly quote still takes the cheap ASCII path in the slices without one.
        piece_ascii = ascii_only or piece.isascii()
        if piece_ascii:
            a = np.frombuffer(piece.encode("ascii"), dtype=np.uint8)
        else:
            # surrogatepass: JSON may carry lone surrogates ("\ud83d"); they must not raise.
            a = np.frombuffer(piece.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)
        if window_left > 0:
            part = a[:window_left]
            window_left -= part.size
            if not piece_ascii:
                window_parts.append(part)
        # (u | 0x20) - 97 maps A-Z and a-z onto 0..25; unsigned wrap puts everything else above.
        folded = a | 0x20
        folded -= 97
        is_word = folded < 26
        letters += int(np.count_nonzero(is_word))
        if not piece_ascii:
            is_high = a >= 0x80
            piece_high = int(np.count_nonzero(is_high))
            if piece_high:
                high_units += piece_high
                wide_units += int(np.count_nonzero(a >= 0x800))
                is_word |= is_high
                if window_left < 0:
                    first = int(np.argmax(is_high))
                    window_parts.append(a[first : first + _SCRIPT_WINDOW_CHARS])
                    window_left = _SCRIPT_WINDOW_CHARS - window_parts[0].size
        # A symbol repeat is an ASCII non-letter equal to the unit before it: for booleans
        # `same > is_word` is `same and not is_word`, one pass instead of two.
        same = a[1:] == a[:-1]
        np.greater(same, is_word[1:], out=same)
        symbol_repeats += int(np.count_nonzero(same))
        if int(a[0]) == previous_unit and not is_word[0]:
            symbol_repeats += 1
        previous_unit = int(a[-1])
        total += a.size
    non_ascii_bytes = 2 * high_units + wide_units
    # Only CJK needs the script check; accented Latin or Cyrillic text skips it.
    share = _traditional_share(window_parts) if wide_units else 0.0
    return TextFeatures(
        letters=letters,
        symbol_starts=total - letters - high_units - symbol_repeats,
        symbol_repeats=symbol_repeats,
        simplified_bytes=non_ascii_bytes * (1.0 - share),
        traditional_bytes=non_ascii_bytes * share,
    )


def _traditional_share(window_parts: list[np.ndarray]) -> float:
    """0.0 (Simplified, also the default without evidence) .. 1.0 (Traditional)."""
    blocks = sum(np.bincount(part >> 6, minlength=1024) for part in window_parts)
    if not isinstance(blocks, np.ndarray):
        return 0.0
    traditional = sum(int(blocks[b]) for b in _TRADITIONAL_BLOCKS)
    if traditional == 0:
        return 0.0
    simplified = sum(int(blocks[b]) for b in _SIMPLIFIED_BLOCKS)
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


_LETTER_BYTES = bytes(range(ord("A"), ord("Z") + 1)) + bytes(range(ord("a"), ord("z") + 1))
_HIGH_BYTES = bytes(range(0x80, 0x100))
_FOUR_BYTE_LEADS = bytes(range(0xF0, 0x100))
_MAX_CJK_RATE = max(TOKENS_PER_SIMPLIFIED_BYTE, TOKENS_PER_TRADITIONAL_BYTE)


def upper_estimate(text: str) -> int:
    """A bound that is never below `fast_estimate(text)`, from three bytes.translate calls.

    It charges symbol repeats like symbol starts and every CJK byte at the dearer script's
    rate, so it over-states code and Simplified Chinese; in exchange it costs a few µs and
    touches no numpy. The request path uses it to skip the fitted estimate for prompts that
    are clearly below every decision threshold: there the bound decides exactly as the
    estimate would. A non-BMP character is 4 UTF-8 bytes but counts 6 in `text_features`
    (UTF-16), hence the two extra bytes per 4-byte sequence.
    """
    if not text:
        return 0
    if text.isascii():
        data = text.encode("ascii")
        high = four_byte = 0
    else:
        data = text.encode("utf-8", "surrogatepass")
        high = len(data) - len(data.translate(None, _HIGH_BYTES))
        four_byte = len(data) - len(data.translate(None, _FOUR_BYTE_LEADS))
    letters = len(data) - len(data.translate(None, _LETTER_BYTES))
    symbols = len(data) - letters - high
    non_ascii = high + 2.0 * four_byte
    tokens = (
        TOKENS_PER_LETTER * letters
        + max(TOKENS_PER_SYMBOL_START, TOKENS_PER_SYMBOL_REPEAT) * symbols
        + _MAX_CJK_RATE * non_ascii
    )
    return max(1, math.ceil(tokens))
