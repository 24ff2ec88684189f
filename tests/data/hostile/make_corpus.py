"""Writes the hostile corpus next to this file: text built to fool a token estimate.

    python tests/data/hostile/make_corpus.py

Each file is ~8 KB of one kind of text without natural word structure, seeded so the files
never change unless this script does. The tests count every file with the real tokenizer
and check the request path's count against it
(tests/extproc/request/tokens/test_tokens.py); the estimator benchmark reports the
fitted estimate's error on each (bench/results/estimator_accuracy.md).
"""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE_BYTES = 8192
CODE = HERE.parent / "code_sample.txt"
ENGLISH = HERE.parent / "en_prose.txt"


def _chars(rng: random.Random, alphabet: str | list[str], size: int) -> str:
    out: list[str] = []
    used = 0
    while used < size:
        c = rng.choice(alphabet)
        out.append(c)
        used += len(c.encode("utf-8"))
    return "".join(out)


def _words(rng: random.Random, alphabet: str, lo: int, hi: int, size: int) -> str:
    words: list[str] = []
    used = 0
    while used < size:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))
        words.append(word)
        used += len(word.encode("utf-8")) + 1
    return " ".join(words)


def _range(lo: int, hi: int) -> list[str]:
    return [chr(c) for c in range(lo, hi + 1)]


def _pseudo_english(rng: random.Random, size: int) -> str:
    """Words from a letter-trigram model of the English sample: English-looking, not English."""
    text = "".join(c.lower() if c.isalpha() else " " for c in ENGLISH.read_text("utf-8"))
    model: dict[str, list[str]] = {}
    for word in text.split():
        word = f"^^{word}$"
        for i in range(len(word) - 2):
            model.setdefault(word[i : i + 2], []).append(word[i + 2])
    words: list[str] = []
    used = 0
    while used < size:
        state, word = "^^", ""
        while len(word) < 14:
            nxt = rng.choice(model[state])
            if nxt == "$":
                break
            word += nxt
            state = state[1] + nxt
        if word:
            words.append(word)
            used += len(word) + 1
    return " ".join(words)


def _minified(rng: random.Random, size: int) -> str:
    code = CODE.read_text("utf-8")
    squeezed = "".join(code.split())
    return (squeezed * (size // len(squeezed) + 1))[:size]


KINDS: dict[str, Callable[[random.Random], str]] = {
    "random_lowercase": lambda r: _chars(r, string.ascii_lowercase, SIZE_BYTES),
    "random_mixed_case": lambda r: _chars(r, string.ascii_letters, SIZE_BYTES),
    "fake_words": lambda r: _words(r, string.ascii_lowercase, 2, 8, SIZE_BYTES),
    "pseudo_english": lambda r: _pseudo_english(r, SIZE_BYTES),
    "base64": lambda r: base64.b64encode(r.randbytes(SIZE_BYTES * 3 // 4)).decode(),
    "hex": lambda r: r.randbytes(SIZE_BYTES // 2).hex(),
    "digits": lambda r: _chars(r, string.digits, SIZE_BYTES),
    "digits_spaced": lambda r: " ".join(_chars(r, string.digits, SIZE_BYTES // 2)),
    "punctuation": lambda r: _chars(r, string.punctuation, SIZE_BYTES),
    "printable_soup": lambda r: _chars(r, string.printable, SIZE_BYTES),
    "minified_code": lambda r: _minified(r, SIZE_BYTES),
    "one_letter_repeated": lambda r: "a" * SIZE_BYTES,
    "one_symbol_repeated": lambda r: "-" * SIZE_BYTES,
    "spaces_repeated": lambda r: " " * SIZE_BYTES,
    "newlines_repeated": lambda r: "\n" * SIZE_BYTES,
    "rare_cjk": lambda r: _chars(r, _range(0x3400, 0x4DBF), SIZE_BYTES),
    "cjk_extension_b": lambda r: _chars(r, _range(0x20000, 0x2A6DF), SIZE_BYTES),
    "random_common_hanzi": lambda r: _chars(r, _range(0x4E00, 0x9FA5), SIZE_BYTES),
    "emoji": lambda r: _chars(r, _range(0x1F300, 0x1F6FF), SIZE_BYTES),
    "combining_marks": lambda r: "".join(
        "a" + r.choice(_range(0x300, 0x36F)) for _ in range(SIZE_BYTES // 3)
    ),
    "zero_width": lambda r: _chars(r, ["\u200b", "\u200c", "\u200d", "\ufeff"], SIZE_BYTES),
    "cyrillic_fake_words": lambda r: _words(r, "".join(_range(0x430, 0x44F)), 2, 8, SIZE_BYTES),
    "arabic_fake_words": lambda r: _words(r, "".join(_range(0x621, 0x64A)), 2, 8, SIZE_BYTES),
    "devanagari": lambda r: _chars(r, _range(0x900, 0x97F), SIZE_BYTES),
    "thai": lambda r: _chars(r, _range(0xE01, 0xE5B), SIZE_BYTES),
    "hangul_syllables": lambda r: _chars(r, _range(0xAC00, 0xD7A3), SIZE_BYTES),
    "private_use": lambda r: _chars(r, _range(0xE000, 0xF8FF), SIZE_BYTES),
    "latin1_soup": lambda r: _chars(r, _range(0xA1, 0xFF), SIZE_BYTES),
    "mixed_scripts": lambda r: _chars(
        r,
        [*string.ascii_letters, *_range(0x430, 0x44F), *_range(0x3400, 0x34FF), "\u0301"],
        SIZE_BYTES,
    ),
    "special_token_lookalikes": lambda r: _chars(
        r, ["<|", "|>", "<\uff5c", "\uff5c>", "<think>", "</think>", "end", "\u2581"], SIZE_BYTES
    ),
}


def main() -> None:
    for name, make in KINDS.items():
        rng = random.Random(f"slogate-hostile-{name}")
        (HERE / f"{name}.txt").write_text(make(rng), encoding="utf-8", newline="")
    print(f"wrote {len(KINDS)} files to {HERE}")


if __name__ == "__main__":
    main()
