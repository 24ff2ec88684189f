"""The files slogate ships inside its package that live in deploy/ in the source tree.

What lives here: the paths of the example policies (the CLI's default `--policy`) and of
the Prometheus alert rules, found with importlib.resources so that they do not depend on
the working directory: an installed slogate reads its own copies from site-packages, a
checkout (the editable install) reads deploy/.

How there is one copy: extproc/shipped/*.yaml are symbolic links into deploy/, where
operators reading the repository look for them; building the sdist or the wheel copies
their content in (docs/contributors/packaging.md). Nothing here generates or copies a file.
Lua scripts and workloads are package data of their own packages (budget/lua,
extproc/usage_tap.lua, sim/workloads) and are read where they are used.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

EXAMPLE_POLICY = "policy.example.yaml"
TENANTS_EXAMPLE_POLICY = "policy.tenants.example.yaml"
ALERT_RULES = "slogate-rules.yaml"


def shipped(name: str) -> Path:
    """The real path of one shipped file. Resolved: in a checkout that is the file in
    deploy/ (what a log line should name), in an installed package its copy."""
    found = resources.files("extproc.shipped").joinpath(name)
    # A wheel installs as plain files, so this is a Path; a zipped install would not be,
    # and the sidecar needs a real path (it watches the policy file and hands it to its
    # workers), so say so rather than extract a temporary copy.
    if not isinstance(found, Path):
        raise FileNotFoundError(f"slogate's {name} is not a file on disk: {found}")
    return found.resolve()


def example_policy() -> Path:
    """deploy/policy.example.yaml: what `slogate up` and `slogate serve` run without
    --policy."""
    return shipped(EXAMPLE_POLICY)


def alert_rules() -> Path:
    """deploy/prometheus/slogate-rules.yaml: the alert and recording rules."""
    return shipped(ALERT_RULES)
