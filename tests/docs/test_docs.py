"""The docs cannot drift: README.md and docs/**/*.md, read as a reader would use them.

- Every `slogate ...` command in a fenced block (and every complete one in an inline code span)
  parses with the CLI's own argparse.
- A fenced block marked `<!-- runnable -->` on the line before its fence runs, by `bash -e
  -o pipefail` (or Python for a `python` block), in a temporary directory with `.venv/bin`
  first on PATH and `$SLOGATE_ROOT` the checkout; one marked `<!-- runnable: stack -->` runs
  against the session's local stack, its `localhost:10000` and `localhost:9464` replaced by the
  stack's ports.
- Every relative link points to a file of the repository, and a `#fragment` to a heading of
  the Markdown file it names.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tooling.cli.main import build_parser
from tooling.stack.local import LocalStack

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages whose links are checked too: the findings beside the benchmark results.
LINKED = [*DOCS, ROOT / "bench" / "results" / "README.md"]
RUN_TIMEOUT_S = 180

_FENCE = re.compile(r"^\s*```(.*)$")
_MARKER = re.compile(r"^<!-- (runnable(?:: stack)?) -->$")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


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
        fence = _FENCE.match(line)
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


def _without_optional(command: str) -> str:
    """A synopsis's `[...]` groups dropped, innermost first."""
    while True:
        dropped = re.sub(r"\[[^\[\]]*\]", "", command)
        if dropped == command:
            return command
        command = dropped


def slogate_argvs(script: str) -> list[list[str]]:
    """The `slogate ...` command lines of a shell block (a `$ ` prompt allowed): continuations
    joined, cut at a pipe, `&&`, `;` or a redirection, comments and `[...]` groups dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        if not line.startswith("slogate "):
            continue
        line = re.split(r"\s(?:\||&&|;|\d?>>?)\s", line)[0]
        words = shlex.split(_without_optional(line), comments=True)
        found.append(words[1:])
    return found


def inline_argvs(text: str) -> list[list[str]]:
    """Complete `slogate ...` commands in inline code spans: a synopsis with alternatives
    (`|`), placeholders (`...`, `<x>`) or unbalanced brackets is left to the prose."""
    found = []
    for span in re.findall(r"`(slogate [^`]+)`", text.replace("\n", " ")):
        command = _without_optional(span)
        if re.search(r"\||\.\.\.|<|>|\[|\]|\(|\)|=$", command):
            continue
        found.append(shlex.split(command)[1:])
    return found


def _documented_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for path in DOCS:
        for block in fenced_blocks(path):
            if block.lang in ("sh", "bash", "console", ""):
                commands += [(block.where, argv) for argv in slogate_argvs(block.text)]
    return commands


def _inline_commands() -> list[tuple[str, list[str]]]:
    return [
        (str(path.relative_to(ROOT)), argv)
        for path in DOCS
        for argv in inline_argvs(path.read_text(encoding="utf-8"))
    ]


def unknown_words(argv: list[str]) -> list[str]:
    """The commands and options of `slogate ARGV` the CLI does not have: prose names a command
    (`slogate keys revoke`) without all it needs, so only names are held to the parser."""
    parser: argparse.ArgumentParser = build_parser()
    unknown: list[str] = []
    words = iter(argv)
    for word in words:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if word.startswith("-"):
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            if action is None:
                unknown.append(word)
            elif action.nargs != 0 and "=" not in word:
                next(words, None)  # its value
        elif commands and word in commands[0].choices:
            parser = commands[0].choices[word]
        elif commands:
            unknown.append(word)  # a command the CLI does not have
            break
    return unknown


DOCUMENTED = _documented_commands()
INLINE = _inline_commands()


@pytest.mark.parametrize(
    "argv", [argv for _, argv in DOCUMENTED], ids=[f"{w} {' '.join(a)}" for w, a in DOCUMENTED]
)
def test_every_documented_command_parses(argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as done:  # 2: an unknown command or option; 0: --version, --help
        assert done.code == 0, f"slogate {' '.join(argv)} does not parse"


@pytest.mark.parametrize(
    "argv", [argv for _, argv in INLINE], ids=[f"{w} {' '.join(a)}" for w, a in INLINE]
)
def test_every_command_named_in_prose_exists(argv: list[str]) -> None:
    assert not unknown_words(argv), f"slogate {' '.join(argv)}: {unknown_words(argv)}"


def test_the_documented_commands_are_found() -> None:
    """The extraction itself: a doc's fenced and inline commands are seen, and a wrong one is
    caught, so the checks above cannot pass by finding nothing."""
    used = {argv[0] for _, argv in DOCUMENTED + INLINE if argv}
    assert {"envoy-config", "k8s", "policy", "simulate", "preflight", "keys", "drill"} <= used
    with pytest.raises(SystemExit):
        build_parser().parse_args(slogate_argvs("slogate envoy-config --no-such-option\n")[0])
    assert unknown_words(["keys", "revoke", "--no-such-option"]) == ["--no-such-option"]
    assert unknown_words(["keyz", "list"]) == ["keyz"]


def _runnable() -> list[Block]:
    return [b for path in DOCS for b in fenced_blocks(path) if b.marker is not None]


def _run(block: Block, tmp: Path, replace: dict[str, str]) -> None:
    text = block.text
    for old, new in replace.items():
        text = text.replace(old, new)
    env = dict(os.environ, SLOGATE_ROOT=str(ROOT))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if block.lang == "python":
        argv = [sys.executable, "-c", text]
    else:
        assert block.lang in ("sh", "bash"), f"{block.where}: cannot run a {block.lang!r} block"
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    done = subprocess.run(
        argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, f"{block.where} failed:\n{text}\n{done.stdout}\n{done.stderr}"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "block", [b for b in _runnable() if b.marker == "runnable"], ids=lambda b: b.where
)
def test_runnable_blocks_run(block: Block, tmp_path: Path) -> None:
    _run(block, tmp_path, {})


@pytest.mark.e2e
@pytest.mark.parametrize(
    "block", [b for b in _runnable() if b.marker == "runnable: stack"], ids=lambda b: b.where
)
def test_runnable_blocks_run_against_the_stack(
    block: Block, stack: LocalStack, tmp_path: Path
) -> None:
    ports = {
        "localhost:10000": f"127.0.0.1:{stack.listen_port}",
        "localhost:9464": f"127.0.0.1:{stack.metrics_port}",
    }
    _run(block, tmp_path, ports)


def test_some_blocks_are_runnable() -> None:
    markers = {b.marker for b in _runnable()}
    assert markers == {"runnable", "runnable: stack"}, markers


def github_anchors(path: Path) -> set[str]:
    """The fragments GitHub gives a Markdown file's headings (outside fenced blocks)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if _FENCE.match(line):
            inside = not inside
            continue
        heading = re.match(r"^#{1,6} (.+)$", line)
        if inside or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    outside = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    outside = re.sub(r"`[^`\n]*`", "", outside)
    return _LINK.findall(outside)


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file(path: Path) -> None:
    broken = []
    for url in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", url):
            continue  # https:, mailto:
        target, _, fragment = url.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            broken.append(f"{url}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in github_anchors(resolved):
            broken.append(f"{url}: no heading #{fragment}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_links() -> None:
    assert len(_links(ROOT / "README.md")) >= 10
    assert "deploy-envoy" in " ".join(_links(ROOT / "docs" / "operators" / "README.md"))
