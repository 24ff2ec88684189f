"""The policy review pipeline as documented: every `slogate` command in the example CI job
(deploy/ci/policy-review.github.yaml) and in the docs' "Reviewing a policy change" is one
this slogate parses, and the job holds a tripped guard for a reviewer."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.support.docs import page_with
from tooling.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "deploy" / "ci" / "policy-review.github.yaml"


def _commands(script: str, env: dict[str, str]) -> list[list[str]]:
    """The `slogate ...` command lines of a shell script, continuations joined, `$(...)`
    taken as a time and `${VAR}` as the job's env gives it."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("slogate "):
            continue
        line = re.sub(r"\$\([^)]*\)", "2026-11-25T00:00:00", line)
        line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line)
        found.append(shlex.split(line)[1:])
    return found


def _job() -> dict:
    return yaml.safe_load(JOB.read_text())


def _job_commands() -> list[list[str]]:
    job = _job()
    steps = [s for j in job["jobs"].values() for s in j["steps"] if "run" in s]
    return [c for s in steps for c in _commands(s["run"], job["env"])]


def _readme_commands() -> list[list[str]]:
    heading = "## Reviewing a policy change"  # docs/operators/policy-changes.md
    readme = page_with(heading)
    start = readme.index(heading)
    end = readme.find("\n## ", start + 1)
    section = readme[start : end if end != -1 else len(readme)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    inline = re.findall(r"`(slogate [^`]*)`", section.replace("\n   ", " "))
    commands = [c for b in blocks for c in _commands(b, {})]
    return commands + [shlex.split(c)[1:] for c in inline if "[" not in c]


@pytest.mark.parametrize("argv", _job_commands() + _readme_commands(), ids=" ".join)
def test_every_documented_command_parses(argv: list[str]) -> None:
    build_parser().parse_args(argv)  # SystemExit on an unknown command or option


def test_the_documented_commands_cover_the_pipeline() -> None:
    used = {tuple(argv[:2]) for argv in _job_commands() + _readme_commands()}
    assert {("policy", "diff"), ("policy", "promote"), ("workload", "fit")} <= used
    assert ("simulate", "--workload") in used


def test_the_job_holds_a_tripped_guard_for_a_reviewer() -> None:
    job = _job()
    ((diff,),) = [[c for c in _job_commands() if c[:2] == ["policy", "diff"]]]
    assert "--traffic" in diff and "--out" in diff
    override = job["jobs"]["override"]
    assert override["needs"] == "diff" and "tripped" in override["if"]
    assert override["environment"] == "policy-guard-override"
    run = next(s["run"] for s in job["jobs"]["diff"]["steps"] if s.get("id") == "diff")
    assert "guard=held" in run and "guard=tripped" in run and 'exit "$code"' in run
