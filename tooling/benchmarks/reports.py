"""Where a benchmark's results go: its report as JSON and its page as Markdown, side by side
in the results folder (bench/results/ by default), under one name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_report(
    out_dir: Path, name: str, report: Mapping[str, Any], markdown: str, indent: int = 1
) -> None:
    """`name`.json (the report, indented by `indent`) and `name`.md (`markdown`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=indent) + "\n")
    (out_dir / f"{name}.md").write_text(markdown)
