"""Every Unicode code point in the contexts its class decides in, tokenized by the reference.

The reference (Hugging Face `tokenizers` on DeepSeek's tokenizer.json) takes ~4 s a context
here for what is the same answer every run, so its answer is kept: one digest per run of
code points in tests/data/every_code_point.json, beside the digest of the tokenizer.json it
came from. The test tokenizes with the fast engine and compares digests; where one differs
it asks the reference for that run alone, to show the first token that differs.

Written again (after the tokenizer package moved) by `python -m tests.support.code_points`.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Sequence
from pathlib import Path

from extproc.request.tokens.reference import ReferenceTokenizer, default_tokenizer_path

GOLDEN = Path(__file__).parents[1] / "data" / "every_code_point.json"
# Contexts a code point's class decides in: after a letter, doubled after a space (the
# whitespace lookahead), after a digit, before a newline, beside CJK and punctuation. Each
# starts and ends with an ASCII letter, so joined with spaces they are cut apart exactly as
# if each were tokenized alone (see bpe._CUT), and any run of them can be compared alone.
CONTEXTS = ("a{c}b", "a {c}{c}b", "a1{c}\nb", "a\u4e00{c}!b")
_RUN = 1 << 16


def runs(context: str) -> list[str]:
    """Every code point but the surrogates, in `context`, 65,536 to a run."""
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    return [
        " ".join(context.format(c=c) for c in points[start : start + _RUN])
        for start in range(0, len(points), _RUN)
    ]


def digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(array("I", ids).tobytes()).hexdigest()


def tokenizer_digest() -> str:
    return hashlib.sha256(default_tokenizer_path().read_bytes()).hexdigest()


def write_golden() -> None:
    tokenizer = ReferenceTokenizer().tokenizer()
    contexts = {
        context: [
            digest(e.ids)
            for e in tokenizer.encode_batch_fast(runs(context), add_special_tokens=False)
        ]
        for context in CONTEXTS
    }
    golden = {"tokenizer_sha256": tokenizer_digest(), "contexts": contexts}
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_golden()
