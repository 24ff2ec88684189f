"""The documentation as tests read it: README.md and every page under docs/.

Tests that hold a doc to the code find the content wherever it lives now (a page moved from
one folder to another keeps its checks), but in exactly one page.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
