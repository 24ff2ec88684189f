"""The admin token the CLI sends (extproc.service.admin_client) and the one `slogate up`
makes (tooling.cli.up): the same file, so a command typed against `slogate up` needs no
--token-file."""

from __future__ import annotations

import stat
from pathlib import Path

from extproc.service.admin_auth import TOKEN_FILE_ENV, ensure_token_file
from extproc.service.admin_client import client_token, client_token_file, default_token_file
from tooling.cli.up import up_token_file


def test_the_cli_finds_the_file_slogate_up_makes(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    assert client_token_file(None, env) is None  # nothing made yet: nothing sent
    made = ensure_token_file(up_token_file(env))  # what LocalStack.start does for `up`
    assert made == tmp_path / "home" / ".local" / "state" / "slogate" / "admin-token"
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    assert client_token_file(None, env) == made
    assert client_token(None, env) == made.read_text().strip()


def test_an_explicit_file_wins_then_the_variable_then_the_default(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), TOKEN_FILE_ENV: str(tmp_path / "named")}
    assert default_token_file(env) == tmp_path / "state" / "slogate" / "admin-token"
    ensure_token_file(default_token_file(env))
    assert client_token_file(None, env) == tmp_path / "named"  # the sidecar's own variable
    assert up_token_file(env) == tmp_path / "named"  # `up` makes the file it names
    assert client_token_file(tmp_path / "given", env) == tmp_path / "given"
