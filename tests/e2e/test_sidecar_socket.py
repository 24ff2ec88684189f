"""A real Envoy calling the sidecar over a Unix socket, as the pod's Envoy does when the
manifests put ext_proc and the access log there (`slogate serve --grpc-socket`, and the
bootstrap `slogate envoy-config --sidecar-socket` renders: the sidecar's cluster at a pipe
address). A request is decided and settled through it."""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy.schema import Policy
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, charged_as_used, random_ports
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.stack.local import LocalStack


@pytest.fixture(scope="module")
def socket_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path]]:
    work = tmp_path_factory.mktemp("sidecar-socket")
    socket_path = work / "grpc.sock"

    def bootstrap(policy: Policy, ports: EnvoyPorts) -> dict[str, Any]:
        return build_bootstrap(policy, dataclasses.replace(ports, sidecar_socket=str(socket_path)))

    stack = LocalStack(
        EXAMPLE_POLICY,
        work,
        random_ports(),
        time_scale=0.05,
        exact_tokenizer=False,
        sidecar_log_args=("--grpc-socket", str(socket_path)),
        bootstrap=bootstrap,
    )
    stack.start()
    try:
        yield stack, socket_path
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_envoy_reaches_the_sidecar_over_a_unix_socket(
    socket_stack: tuple[LocalStack, Path],
) -> None:
    stack, socket_path = socket_stack
    # The group may connect (Envoy's user in the pod's fsGroup), nobody else.
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
    reply = post(stack.url, CHAT, chat_body("What is the capital of France?"))
    assert reply.status == 200, reply.body
    # Only the sidecar's decision names a pool: ext_proc went through the socket ...
    assert reply.headers["x-slogate-pool"] == "default"
    # ... and the access log came back through it: the request was settled by its usage.
    charged_as_used(stack)
