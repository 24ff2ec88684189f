"""The version is written once (extproc/version.py): the installed package's metadata and
`slogate --version` both say it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from extproc.version import VERSION


def test_the_package_metadata_reads_the_one_version() -> None:
    assert importlib.metadata.version("slogate") == VERSION


def test_slogate_version_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tooling.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.strip() == f"slogate {VERSION}"
