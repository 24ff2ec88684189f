"""The documentation as tests read it: README.md and every page under docs/.

Tests that hold a doc to the code find the content wherever it lives now (a page moved from
one folder to another keeps its checks), but in exactly one page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*```(.*)$")
_MARKER = re.compile(r"^<!-- (runnable(?:: stack)?) -->$")


def doc_pages() -> list[Path]:
    """README.md first, then docs/**/*.md in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_docs() -> str:
    return "\n\n".join(page.read_text(encoding="utf-8") for page in doc_pages())


def page_with(text: str) -> str:
    """The one page that holds `text` (a heading, a marker), whole."""
    holding = [p for p in doc_pages() if text in p.read_text(encoding="utf-8")]
    assert len(holding) == 1, f"{text!r} is in {len(holding)} doc pages: {holding}"
    return holding[0].read_text(encoding="utf-8")


@dataclass(frozen=True)
class Block:
    """A fenced block of a doc: where it is, its info string, its marker and its text."""

    path: Path
    line: int
    lang: str
    marker: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    start: int | None = None
    lang, marker = "", None
    for i, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence is None:
            continue
        if start is None:
            start, lang = i, fence.group(1).strip()
            before = _MARKER.match(lines[i - 1].strip()) if i else None
            marker = before.group(1) if before else None
        else:
            body = "\n".join(lines[start + 1 : i]) + "\n"
            found.append(Block(path, start + 1, lang, marker, body))
            start = None
    assert start is None, f"{path.relative_to(ROOT)}:{start}: a fence that never closes"
    return found


def runnable_blocks() -> list[Block]:
    """The fenced blocks marked `<!-- runnable -->` or `<!-- runnable: stack -->`, in every page."""
    return [b for path in doc_pages() for b in fenced_blocks(path) if b.marker is not None]
