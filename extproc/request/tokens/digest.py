"""The digest that keys a message's text in the counting caches (the prompt counter's
counts, the template's ids): 16 bytes of SHA-256 or of BLAKE2b, whichever this CPU
computes faster, chosen once at import; and `utf8_key`, a text's UTF-8 length and digest
from the UTF-8 the str itself keeps.

Every routed prompt's text is hashed on the request path (a miss costs the count, a hit
saves it: chats resend their history), so the hash is paid per byte of every prompt. Where
the CPU has SHA extensions (OpenSSL uses them: most x86-64 since 2017-2019, ARMv8 with the
crypto extension) SHA-256 runs at twice BLAKE2b's speed or more: on these machines 41 µs
against 94 for a 24 KB prompt, ~50 µs per field-mix request. Without them BLAKE2b is the
faster. Either is collision-resistant at 128 bits; the key never leaves the process.

Why `utf8_key` reads the str's own UTF-8: text that is not ASCII costs a pass to turn into
UTF-8 (~18 µs for a field-mix prompt), and the tokenizer (fastokens, a PyO3 extension)
reads its text through `PyUnicode_AsUTF8AndSize`, which makes that UTF-8 once and keeps it
inside the str. Made there first, it serves the digest, the lone-surrogate check
(`reference.encodable`) and the tokenizer: one pass where `str.encode` for the key, again
for the check, and the tokenizer's own made three.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections.abc import Callable

# The str's UTF-8, made and kept inside it on first use; raises UnicodeEncodeError for a
# lone surrogate (which has no UTF-8). The C API's own function: ctypes.pythonapi holds
# the GIL through the call and raises the error it sets.
_as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_as_utf8.restype = ctypes.c_void_p
_as_utf8.argtypes = (ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t))
# A read-only memoryview on that memory, not a copy (PyBUF_READ = 0x100).
_view = ctypes.pythonapi.PyMemoryView_FromMemory
_view.restype = ctypes.py_object
_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_READ = 0x100


def _sha256(raw: bytes | memoryview) -> bytes:
    return hashlib.sha256(raw).digest()[:16]


def _blake2b(raw: bytes | memoryview) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def _fastest() -> Callable[[bytes | memoryview], bytes]:
    sample = bytes(range(256)) * 256  # 64 KB
    spent: dict[Callable[[bytes | memoryview], bytes], float] = {}
    for digest in (_sha256, _blake2b):
        best = float("inf")
        for _ in range(3):  # the best of three: a neighbour's burst hits one, not all
            started = time.perf_counter()
            digest(sample)
            best = min(best, time.perf_counter() - started)
        spent[digest] = best
    return min(spent, key=spent.__getitem__)


text_digest: Callable[[bytes | memoryview], bytes] = _fastest()


def keeps_utf8(text: str) -> bool:
    """Whether `text` has UTF-8 (no lone surrogate), made and kept inside the str if it was
    not yet: what the tokenizer reads next costs no pass of its own then."""
    try:
        _as_utf8(text, None)
    except UnicodeEncodeError:
        return False
    return True


def utf8_key(text: str, digest_min_bytes: int) -> tuple[int, bytes | None]:
    """`text`'s UTF-8 length (lone surrogates as "surrogatepass" writes them, 3 bytes each)
    and, where that is at least `digest_min_bytes`, the digest of those bytes: the same as
    `text_digest(text.encode("utf-8", "surrogatepass"))`. The UTF-8 stays inside the str
    (see the module's doc)."""
    if len(text) * 4 < digest_min_bytes:  # at most 4 bytes a character: short whatever it is
        return len(text.encode("utf-8", "surrogatepass")), None
    size = ctypes.c_ssize_t()
    try:
        address = _as_utf8(text, ctypes.byref(size))
    except UnicodeEncodeError:  # no UTF-8 of its own: keyed as before, by surrogatepass
        raw = text.encode("utf-8", "surrogatepass")
        return len(raw), text_digest(raw) if len(raw) >= digest_min_bytes else None
    if size.value < digest_min_bytes:
        return size.value, None
    # The view borrows the str's memory without holding the str: released before return,
    # while `text` (the caller's reference) keeps it alive.
    view = _view(address, size.value, _PYBUF_READ)
    try:
        return size.value, text_digest(view)
    finally:
        view.release()
