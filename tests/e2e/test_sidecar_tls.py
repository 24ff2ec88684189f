"""A real Envoy calling the sidecar over mutual TLS, as a gateway calls an endpoint picker
in another Deployment: `slogate serve --tls-cert --tls-key --tls-client-ca`, and the
bootstrap `slogate envoy-config --sidecar-tls-*` renders (its sidecar cluster's upstream TLS
with Envoy's client certificate). Certificates from a CA made at test time. A request is
decided and settled through it; a plain-text client is refused at the sidecar's port."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from policy.schema import Policy
from tests.support.certificates import SERVER_NAME, Issued, issue
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import EXAMPLE_POLICY, charged_as_used, random_ports
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.profile import EnvoyPorts, SidecarTls
from tooling.stack.local import LocalStack


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Issued]]:
    work = tmp_path_factory.mktemp("sidecar-tls")
    issued = issue(work / "pki")
    envoy_side = SidecarTls(
        str(issued.ca), SERVER_NAME, str(issued.client_cert), str(issued.client_key)
    )

    def bootstrap(policy: Policy, ports: EnvoyPorts) -> dict[str, Any]:
        return build_bootstrap(policy, dataclasses.replace(ports, sidecar_tls=envoy_side))

    stack = LocalStack(
        EXAMPLE_POLICY,
        work,
        random_ports(),
        time_scale=0.05,
        exact_tokenizer=False,
        sidecar_log_args=tuple(
            part
            for flag, path in (
                ("--tls-cert", issued.server_cert),
                ("--tls-key", issued.server_key),
                ("--tls-client-ca", issued.ca),
            )
            for part in (flag, str(path))
        ),
        bootstrap=bootstrap,
    )
    stack.start()
    try:
        yield stack, issued
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_envoy_reaches_the_sidecar_over_mutual_tls(tls_stack: tuple[LocalStack, Issued]) -> None:
    stack, _ = tls_stack
    reply = post(stack.url, CHAT, chat_body("What is the capital of France?"))
    assert reply.status == 200, reply.body
    # Only the sidecar's decision names a pool: ext_proc went through (whatever the
    # failure mode), and the access log came back over the same TLS cluster.
    assert reply.headers["x-slogate-pool"] == "default"
    charged_as_used(stack)


def test_a_plain_text_client_is_refused(tls_stack: tuple[LocalStack, Issued]) -> None:
    stack, _ = tls_stack

    async def check() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
            try:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=5
                )
            except grpc.aio.AioRpcError as error:
                return error.code()
        return grpc.StatusCode.OK

    assert asyncio.run(check()) is grpc.StatusCode.UNAVAILABLE
