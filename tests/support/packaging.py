"""The distribution as pyproject.toml declares it: the repository's root and the top-level
packages the wheel installs."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The top-level packages, as pyproject's find section includes them ("policy*" -> policy).
PACKAGES = sorted(
    pattern.rstrip("*")
    for pattern in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
)
