"""The counting caches' text digest: 16 bytes, one per text, either candidate's."""

from __future__ import annotations

import hashlib

from extproc.request.tokens.digest import _blake2b, _sha256, text_digest


def test_the_digest_keys_a_text_by_its_bytes() -> None:
    raw = b"a chat's resent history " * 100
    assert text_digest(raw) == text_digest(bytes(raw))
    assert len(text_digest(raw)) == 16
    assert text_digest(raw) != text_digest(raw + b".")
    assert text_digest in (_sha256, _blake2b)
    assert _sha256(raw) == hashlib.sha256(raw).digest()[:16]
    assert _blake2b(raw) == hashlib.blake2b(raw, digest_size=16).digest()
