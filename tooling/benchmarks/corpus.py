"""The estimator benchmark's corpus: natural text already on this machine, never
downloaded, in languages the estimate was fitted on and a few it was not; cut into samples
whose exact token count is known (see tooling.benchmarks.estimator for the sources)."""

from __future__ import annotations

import gettext
import glob
import html
import random
import re
import struct
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.request.tokens.reference import ReferenceTokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_DATA_DIR = REPO_ROOT / "tests" / "data"

_CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_TAG = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"[ \t\u00a0\u3000]+")


@dataclass(frozen=True)
class Document:
    source: str
    text: str


@dataclass(frozen=True)
class Sample:
    language: str
    size_tokens: int  # the size it was cut for; `exact_tokens` is what it has
    half: str  # "fit" or "eval"
    from_full_pool: bool
    text: str
    exact_tokens: int


# --- corpus ---------------------------------------------------------------------------


def _read(path: str | Path, encoding: str = "utf-8") -> str:
    return Path(path).read_text(encoding=encoding, errors="replace")


def _files(*patterns: str) -> list[str]:
    found: set[str] = set()
    for pattern in patterns:
        found.update(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    return sorted(found)


def english_documents() -> list[Document]:
    import pydoc_data.topics

    docs = [
        Document(f"pydoc_data.topics[{name!r}]", text)
        for name, text in sorted(pydoc_data.topics.topics.items())
    ]
    for path in _files("/usr/share/common-licenses/*", "/usr/share/vim/vim*/doc/usr_*.txt"):
        docs.append(Document(path, _read(path)))
    return docs


def _chinese_lines(text: str, strip: bool) -> str:
    kept = []
    for line in text.splitlines():
        line = line.strip() if strip else line.rstrip()
        cjk = len(_CJK.findall(line))
        if cjk >= 4 and cjk >= 0.3 * len(line.replace(" ", "")):
            kept.append(line)
    return "\n".join(kept)


def _web_page_text(path: str, encoding: str) -> str:
    text = _read(path, encoding)
    for _ in range(2):  # RSS wraps escaped HTML inside CDATA: unescape, strip, again
        text = _TAG.sub(" ", html.unescape(text))
    return _SPACES.sub(" ", text)


def _gettext_messages(path: str) -> str:
    try:
        with open(path, "rb") as f:
            catalog: dict[Any, Any] = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
    except (OSError, ValueError, struct.error):  # a foreign or damaged catalog
        return ""
    return "\n\n".join(v for v in catalog.values() if isinstance(v, str) and len(v) >= 40)


def _chinese_documents(traditional: bool) -> list[Document]:
    raw: list[tuple[str, str, bool]] = []  # source, text, strip lines
    if traditional:
        for path in _files("/usr/share/vim/vim*/tutor/tutor.zh_tw.utf-8"):
            raw.append((path, _read(path), False))
        for path in _files("/usr/lib/google-cloud-sdk/**/chardet/tests/Big5/*"):
            raw.append((path, _web_page_text(path, "big5hkscs"), True))
    else:
        for path in _files(
            "/usr/share/vim/vim*/tutor/tutor.zh_cn.utf-8",
            "/usr/share/gnupg/help.zh_CN.txt",
            "/usr/lib/systemd/catalog/systemd.zh_CN.catalog",
        ):
            raw.append((path, _read(path), False))
        for path in _files("/usr/share/locale/zh_CN/LC_MESSAGES/*.mo"):
            raw.append((path, _gettext_messages(path), False))
        for path in _files("/usr/lib/google-cloud-sdk/**/chardet/tests/GB2312/*"):
            raw.append((path, _web_page_text(path, "gb18030"), True))
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for name in ("gb2312", "gbk"):
            path = str(stdlib / "test" / "cjkencodings" / f"{name}-utf8.txt")
            raw.extend((p, _read(p), False) for p in _files(path))
    docs = []
    for source, text, strip in raw:
        prose = _chinese_lines(text, strip)
        if len(prose) >= 200:
            docs.append(Document(source, prose))
    return docs


def code_documents() -> list[Document]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [str(p) for p in sorted(stdlib.glob("*.py"))]
    paths += _files("/usr/include/*.h", "/usr/lib/node_modules/npm/lib/**/*.js")
    return [Document(p, _read(p)) for p in paths]


def other_documents(language: str) -> list[Document]:
    paths = _files(f"/usr/share/vim/vim*/tutor/tutor.{language}.utf-8")
    return [Document(p, _read(p)) for p in paths]


def _fallback_documents(language: str) -> list[Document]:
    name = {
        "en": "en_prose.txt",
        "zh-Hans": "zh_hans_prose.txt",
        "zh-Hant": "zh_hant_prose.txt",
        "code": "code_sample.txt",
    }
    path = TEST_DATA_DIR / name.get(language, "")
    return [Document(str(path), _read(path))] if path.is_file() else []


def load_documents(language: str) -> list[Document]:
    loaders: dict[str, Callable[[], list[Document]]] = {
        "en": english_documents,
        "zh-Hans": lambda: _chinese_documents(traditional=False),
        "zh-Hant": lambda: _chinese_documents(traditional=True),
        "code": code_documents,
    }
    loader = loaders.get(language)
    docs = loader() if loader else other_documents(language)
    return docs or _fallback_documents(language)


# --- samples ------------------------------------------------------------------------------


def _cut(stream: str, length_chars: int, rng: random.Random) -> str:
    """A slice of about `length_chars` starting at a line boundary."""
    if length_chars >= len(stream):
        return stream
    offset = rng.randrange(0, len(stream) - length_chars)
    newline = stream.find("\n", offset, offset + 200)
    if newline >= 0 and newline + 1 + length_chars <= len(stream):
        offset = newline + 1
    return stream[offset : offset + length_chars]


def build_samples(
    language: str,
    docs: Sequence[Document],
    sizes: dict[int, int],
    counter: ReferenceTokenizer,
    rng: random.Random,
    halves: Iterable[str] = ("fit", "eval"),
) -> list[Sample]:
    full = "\n\n".join(d.text for d in docs)
    probe = full[:400_000]
    chars_per_token = len(probe) / max(1, counter.count(probe))
    samples: list[Sample] = []
    for half in halves:
        parity = 0 if half == "fit" else 1
        part = [d.text for i, d in enumerate(docs) if i % 2 == parity] or [full]
        stream = "\n\n".join(part)
        for size_tokens, how_many in sizes.items():
            length_chars = int(size_tokens * chars_per_token)
            from_full = length_chars > 0.5 * len(stream)
            source = full if from_full else stream
            texts = [_cut(source, length_chars, rng) for _ in range(how_many)]
            counts = counter.count_many(texts)
            samples.extend(
                Sample(language, size_tokens, half, from_full, t, n)
                for t, n in zip(texts, counts, strict=True)
                if n > 0
            )
    return samples


def _source_group(source: str) -> str:
    """Collapse per-file sources into families for the report."""
    for marker, group in (
        ("pydoc_data.topics", "python: pydoc_data.topics"),
        ("common-licenses", "/usr/share/common-licenses"),
        ("/doc/usr_", "vim user manual"),
        ("LC_MESSAGES", "gettext zh_CN translations (.mo)"),
        ("chardet/tests/GB2312", "chardet test data: GB2312 web pages"),
        ("chardet/tests/Big5", "chardet test data: Big5 web pages"),
        ("cjkencodings", "cpython test/cjkencodings"),
        ("/usr/include/", "C headers /usr/include"),
        ("node_modules/npm", "npm JavaScript"),
        ("/tutor/", "vim tutor"),
        ("tests/data", "tests/data (hand-written fallback)"),
    ):
        if marker in source:
            return group
    if source.endswith(".py"):
        return "python stdlib modules"
    return source
