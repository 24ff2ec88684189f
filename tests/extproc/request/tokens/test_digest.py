"""The counting caches' text digest: 16 bytes, one per text, either candidate's."""

from __future__ import annotations

import hashlib
import random

from extproc.request.tokens.digest import _blake2b, _sha256, keeps_utf8, text_digest, utf8_key
from extproc.request.tokens.reference import encodable


def test_the_digest_keys_a_text_by_its_bytes() -> None:
    raw = b"a chat's resent history " * 100
    assert text_digest(raw) == text_digest(bytes(raw))
    assert len(text_digest(raw)) == 16
    assert text_digest(raw) != text_digest(raw + b".")
    assert text_digest in (_sha256, _blake2b)
    assert _sha256(raw) == hashlib.sha256(raw).digest()[:16]
    assert _blake2b(raw) == hashlib.blake2b(raw, digest_size=16).digest()


def _texts() -> list[str]:
    """Texts of every kind a prompt holds: ASCII, Latin, CJK, emoji, lone surrogates (JSON
    "\\ud83d" escapes), around the counter's 256-byte digest threshold."""
    rng = random.Random(39)
    ranges = [(32, 126), (32, 0x2FF), (0x4E00, 0x9FFF), (0xD7F0, 0xE010), (0x1F600, 0x1F64F)]
    texts = ["", "a", "x" * 300, "é" * 128, "\ud83d" * 86, "a \udc00 b " * 60, "😀" * 63]
    for size in (1, 63, 64, 65, 85, 86, 127, 128, 255, 256, 257, 4000):
        for low, high in ranges:
            texts.append("".join(chr(rng.randint(low, high)) for _ in range(size)))
    return texts


def test_the_utf8_key_is_the_encoded_texts_length_and_digest() -> None:
    """The counting caches' keys stay what `str.encode` gave: a count cached before the
    UTF-8 was read from the str finds the same entry, and lone surrogates keep their
    "surrogatepass" key. Asked twice: the second time the str holds its UTF-8."""
    for text in _texts():
        raw = text.encode("utf-8", "surrogatepass")
        for digest_min_bytes in (0, 256):
            want = (len(raw), text_digest(raw) if len(raw) >= digest_min_bytes else None)
            fresh = "".join([text[:1], text[1:]])  # a new str, no UTF-8 kept yet
            assert utf8_key(fresh, digest_min_bytes) == want
            assert utf8_key(fresh, digest_min_bytes) == want


def test_encodable_replaces_lone_surrogates_only() -> None:
    for text in _texts():
        try:
            text.encode("utf-8")
            want = text
        except UnicodeEncodeError:
            want = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        assert encodable(text) == want
        assert keeps_utf8(text) == (want is text)
