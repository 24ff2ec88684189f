"""The docs' runnable blocks run (the rest of the docs' checks: tests/docs/test_docs.py).

A fenced block marked `<!-- runnable -->` on the line before its fence runs, by `bash -e
-o pipefail` (or Python for a `python` block), in a temporary directory with `.venv/bin`
first on PATH and `$SLOGATE_ROOT` the checkout; one marked `<!-- runnable: stack -->` runs
against the session's local stack, its `localhost:10000` and `localhost:9464` replaced by the
stack's ports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import ROOT, Block, runnable_blocks
from tooling.stack.local import LocalStack

RUN_TIMEOUT_S = 180


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


@pytest.mark.parametrize(
    "block", [b for b in runnable_blocks() if b.marker == "runnable"], ids=lambda b: b.where
)
def test_runnable_blocks_run(block: Block, tmp_path: Path) -> None:
    _run(block, tmp_path, {})


@pytest.mark.parametrize(
    "block", [b for b in runnable_blocks() if b.marker == "runnable: stack"], ids=lambda b: b.where
)
def test_runnable_blocks_run_against_the_stack(
    block: Block, stack: LocalStack, tmp_path: Path
) -> None:
    ports = {
        "localhost:10000": f"127.0.0.1:{stack.listen_port}",
        "localhost:9464": f"127.0.0.1:{stack.metrics_port}",
    }
    _run(block, tmp_path, ports)
