"""The docs cannot drift: README.md and docs/**/*.md, read as a reader would use them.

- Every `slogate ...` command in a fenced block (and every complete one in an inline code span)
  parses with the CLI's own argparse.
- Every relative link points to a file of the repository, and a `#fragment` to a heading of
  the Markdown file it names.

The blocks marked runnable are run in tests/e2e/docs/test_docs.py."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tests.support.docs import FENCE, fenced_blocks, runnable_blocks
from tooling.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages whose links are checked too: the findings beside the benchmark results.
LINKED = [*DOCS, ROOT / "bench" / "results" / "README.md"]

_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


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


def test_some_blocks_are_runnable() -> None:
    markers = {b.marker for b in runnable_blocks()}
    assert markers == {"runnable", "runnable: stack"}, markers


def github_anchors(path: Path) -> set[str]:
    """The fragments GitHub gives a Markdown file's headings (outside fenced blocks)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(line):
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
