"""The admin API against a running stack, through the CLI the way an SRE uses it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from extproc.service.admin_auth import TOKEN_FILE_ENV, WRONG_TOKEN
from extproc.service.admin_client import default_token_file
from tests.support.http import chat_body, post
from tests.support.stack import ROOT, admin_status, slogate
from tooling.stack.local import LocalStack


def test_status_shows_every_breaker_with_signals(stack: LocalStack) -> None:
    post(stack.url, "/v1/chat/completions", chat_body("hi"))
    table = slogate(stack, "status")
    assert table.returncode == 0, table.stderr
    for pool in ("default", "long", "fallback", "global"):
        assert pool in table.stdout
    assert "budget store memory" in table.stdout
    reply = json.loads(slogate(stack, "status", "--json").stdout)
    assert {b["pool"] for b in reply["breakers"]} == {"default", "long", "fallback", "global"}
    assert reply["keys"] >= 4 and reply["budgetStore"] == "memory"
    assert set(reply["quotaMultipliers"]) == {"critical", "standard", "sheddable"}
    assert "quota multipliers:" in table.stdout


def test_keys_show_limits_and_usage_never_the_key(stack: LocalStack) -> None:
    post(stack.url, "/v1/chat/completions", chat_body("count me"), key="sk-demo-critical")
    reply = json.loads(slogate(stack, "keys", "--tenant", "demo-critical", "--json").stdout)
    (key,) = reply["keys"]
    assert key["tier"] == "critical" and len(key["keyId"]) == 12
    assert key["limits"]["requestsPerMinute"] == "600"
    table = slogate(stack, "keys").stdout
    assert "demo-small" in table and "sk-demo" not in table


def test_drill_through_the_admin_api_and_back(stack: LocalStack) -> None:
    drilled = slogate(stack, "drill", "--pool", "long", "--level", "2", "--minutes", "5")
    assert drilled.returncode == 0, drilled.stderr
    status = json.loads(slogate(stack, "status", "--json").stdout)
    long = next(b for b in status["breakers"] if b["pool"] == "long")
    assert long["level"] == 2 and long["drillLevel"] == 2
    refused = post(
        stack.url, "/v1/chat/completions", chat_body(" word" * 40_000), key="sk-demo-batch"
    )
    assert refused.status == 429  # sheddable on a pool drilled to L2: the protocol's 429
    assert (
        slogate(stack, "drill", "--pool", "long", "--level", "0", "--minutes", "0").returncode == 0
    )
    status = json.loads(slogate(stack, "status", "--json").stdout)
    assert next(b for b in status["breakers"] if b["pool"] == "long")["level"] == 0
    unknown = slogate(stack, "drill", "--pool", "nope", "--level", "1")
    assert unknown.returncode == 2 and "NOT_FOUND" in unknown.stderr


def test_a_drill_without_the_token_is_refused_and_the_cli_finds_the_up_token(
    stack: LocalStack, tmp_path: Path
) -> None:
    """The stack's sidecar has a token (as `slogate up`'s and the manifests' have): a drill
    sent without it is refused, saying how, and the breaker does not move; the same command
    succeeds once the token is in the file `slogate up` writes, where the CLI looks."""
    assert stack.admin_token_file is not None
    env = {k: v for k, v in os.environ.items() if k != TOKEN_FILE_ENV}
    env["XDG_STATE_HOME"] = str(tmp_path)  # no default token file yet
    drill = ["drill", "--pool", "long", "--level", "3", "--minutes", "1"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tooling.cli.main", *args, "--admin", stack.admin_address]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)

    refused = cli(*drill)
    assert refused.returncode == 2
    assert f"UNAUTHENTICATED: {WRONG_TOKEN}" in refused.stderr
    assert "no admin token found to send" in refused.stderr
    long = next(b for b in admin_status(stack)["breakers"] if b["pool"] == "long")
    assert long["level"] == 0 and long["drillLevel"] == 0  # read without a token
    assert cli("status", "--json").returncode == 0  # reads need none

    default = default_token_file(env)
    default.parent.mkdir(mode=0o700)
    shutil.copy(stack.admin_token_file, default)
    try:
        drilled = cli(*drill)
        assert drilled.returncode == 0, drilled.stderr
        long = next(b for b in admin_status(stack)["breakers"] if b["pool"] == "long")
        assert long["level"] == 3
    finally:
        ended = cli("drill", "--pool", "long", "--level", "0", "--minutes", "0")
        assert ended.returncode == 0, ended.stderr


def test_reload_reports_success(stack: LocalStack) -> None:
    reloaded = slogate(stack, "reload")
    assert reloaded.returncode == 0 and "reloaded" in reloaded.stdout


def test_generated_admin_code_is_current() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                "-Iprotos",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                f"--pyi_out={out}",
                "protos/extproc/adminpb/admin.proto",
            ],
            cwd=ROOT,
            check=True,
            timeout=60,
        )
        for name in ("admin_pb2.py", "admin_pb2_grpc.py", "admin_pb2.pyi"):
            fresh = (Path(out) / "extproc" / "adminpb" / name).read_text()
            committed = (ROOT / "extproc" / "adminpb" / name).read_text()
            assert fresh == committed, f"{name} is stale: run `make protos`"


@pytest.mark.parametrize("command", [["status"], ["keys"], ["status", "--json"]])
def test_a_reader_that_leaves_early_gets_no_traceback(
    stack: LocalStack, command: list[str]
) -> None:
    """`slogate status | head`: the pipe closes before slogate has written. Here the reading
    end is closed before it starts, so every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tooling.cli.main", *command, "--admin", stack.admin_address],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.returncode == 141
