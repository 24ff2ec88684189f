"""`slogate up` keeps Envoy up when a sidecar dies: the sidecar is started again on its
ports, and a port that is really taken gets one line naming it, not a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from extproc.runtime.processes import python_module
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, start_stack, wait_for


def test_a_killed_sidecar_is_restarted_on_its_ports_while_envoy_stays_up(
    tmp_path: Path,
) -> None:
    stack = start_stack(tmp_path)
    try:
        assert post(stack.url, CHAT, chat_body()).status == 200
        envoy, old = stack.envoy, stack.sidecar
        assert envoy is not None and old is not None and old.pid is not None
        grpc_port = stack.grpc_port
        os.kill(old.pid, signal.SIGKILL)  # with Envoy's connections to it open
        assert wait_for(lambda: not old.running(), 5)
        down = post(stack.url, CHAT, chat_body())
        assert down.status != 200  # failure mode closed: Envoy answers, nothing is routed
        restarted = stack.supervise()
        assert restarted == ["sidecar (exit -9)"]
        assert stack.grpc_port == grpc_port and envoy.running()
        assert wait_for(lambda: post(stack.url, CHAT, chat_body()).status == 200, 10)
        assert stack.supervise() == []  # nothing else to do
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


@pytest.mark.parametrize("taken_by", ["admin", "grpc"])
def test_a_taken_port_is_one_line_naming_it(tmp_path: Path, taken_by: str) -> None:
    """The gRPC port binds after /metrics and the admin API have started (so that on stop
    ext_proc goes first): those stop again before the one line, not at the interpreter's
    exit with a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        grpc_port, admin_port = (port, 0) if taken_by == "grpc" else (0, port)
        argv = python_module(
            "tooling.cli.main",
            "serve",
            "--policy", str(EXAMPLE_POLICY),
            "--grpc-port", str(grpc_port),
            "--metrics-port", "0",
            "--admin-address", f"127.0.0.1:{admin_port}",
            "--no-exact-tokenizer",
        )  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    what = "the sidecar's gRPC port" if taken_by == "grpc" else "the admin API"
    assert f"cannot listen on 127.0.0.1:{port} ({what})" in done.stderr
    for noise in ("Traceback", "Exception ignored", "never awaited"):
        assert noise not in done.stderr, done.stderr
