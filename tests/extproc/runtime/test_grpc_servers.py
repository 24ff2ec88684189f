"""The sidecar's gRPC listener as a gateway and the kubelet see it (extproc.runtime.grpc_servers):
the endpoint picker protocol's health service names, TLS and mutual TLS on the gRPC port,
the plain-text health port beside it, and, in a pod, ext_proc and the access log on a Unix
socket with only the health service on the pod's address. A real sidecar in this process,
real gRPC clients."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2_grpc
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.runtime.grpc_servers import ListenerTls, PortTaken, bind, claim_socket
from extproc.runtime.sidecar import Sidecar
from tests.support.certificates import SERVER_NAME, Issued, issue
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import _headers_message

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The names proposal 004 of the Gateway API inference extension lists, and "" (the server).
PICKER_SERVICES = ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "")


def _policy(tmp_path: Path) -> Path:
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False  # no pools run here
    return write_policy(tmp_path / "policy.yaml", policy)


async def statuses(channel: grpc.aio.Channel) -> dict[str, int]:
    stub = health_pb2_grpc.HealthStub(channel)
    return {
        service: (
            await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        ).status
        for service in PICKER_SERVICES
    }


def tls_channel(port: int, issued: Issued, client_cert: bool = True) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=issued.ca.read_bytes(),
        private_key=issued.client_key.read_bytes() if client_cert else None,
        certificate_chain=issued.client_cert.read_bytes() if client_cert else None,
    )
    # The certificate names slogate.test and 127.0.0.1; the override checks the name.
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options)


async def test_the_picker_protocols_health_names_answer_on_a_plain_sidecar(tmp_path: Path) -> None:
    sidecar = Sidecar(
        _policy(tmp_path), grpc_port=0, metrics_port=None, admin_address=None, exact_tokenizer=False
    )
    address = await sidecar.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{address.grpc_port}") as channel:
            assert await statuses(channel) == dict.fromkeys(PICKER_SERVICES, SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10
                )
            assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await sidecar.stop(grace_s=0.5)


@pytest.fixture
async def mutual_tls(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, int, int, Issued]]:
    """A sidecar whose gRPC port asks for TLS and a client certificate, with a plain-text
    health port; its gRPC port, its health port, the certificates."""
    issued = issue(tmp_path / "pki")
    sidecar = Sidecar(
        _policy(tmp_path),
        grpc_port=0,
        metrics_port=None,
        admin_address=None,
        exact_tokenizer=False,
        tls=ListenerTls(issued.server_cert, issued.server_key, issued.ca),
        health_port=0,
    )
    address = await sidecar.start()
    assert address.health_port is not None
    try:
        yield sidecar, address.grpc_port, address.health_port, issued
    finally:
        await sidecar.stop(grace_s=0.5)


async def test_tls_callers_are_served_and_plain_text_or_anonymous_ones_refused(
    mutual_tls: tuple[Sidecar, int, int, Issued],
) -> None:
    _, port, health_port, issued = mutual_tls
    async with tls_channel(port, issued) as channel:
        assert await statuses(channel) == dict.fromkeys(PICKER_SERVICES, SERVING)
        # ext_proc itself over TLS: a header message gets its reply.
        call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=10)
        await call.write(_headers_message("/v1/chat/completions", "sk-demo-standard", b"{}"))
        reply = await call.read()
        assert isinstance(reply, pb.ProcessingResponse) and reply.HasField("request_headers")
        await call.done_writing()
    for refused in (
        grpc.aio.insecure_channel(f"127.0.0.1:{port}"),  # plain text on the TLS port
        tls_channel(port, issued, client_cert=False),  # TLS without a client certificate
    ):
        async with refused as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=5
                )
            assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
    # The kubelet's probe: plain text on the health port, the same answers.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
        assert await statuses(channel) == dict.fromkeys(PICKER_SERVICES, SERVING)


async def test_a_draining_sidecar_is_alive_but_not_ready(
    mutual_tls: tuple[Sidecar, int, int, Issued],
) -> None:
    """While stop lets a stream in flight finish, the gateway and the kubelet read it as
    not ready (it leaves the endpoints) but alive (it is not restarted)."""
    sidecar, port, health_port, issued = mutual_tls
    async with tls_channel(port, issued) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=60)
        await call.write(_headers_message("/v1/chat/completions", "sk-demo-standard", b"{}"))
        await call.read()  # the stream is open and stays so until we finish it
        stopping = asyncio.ensure_future(sidecar.stop(grace_s=30))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as health:
            seen = await statuses(health)
            while seen[""] == SERVING:  # until the drain has begun
                await asyncio.sleep(0.05)
                seen = await statuses(health)
            assert seen == {
                "liveness": SERVING,
                "readiness": NOT_SERVING,
                "envoy.service.ext_proc.v3.ExternalProcessor": NOT_SERVING,
                "": NOT_SERVING,
            }
        await call.done_writing()  # the stream in flight ends: the drain need not wait
        await stopping


async def test_in_a_pod_the_pod_address_answers_health_alone(tmp_path: Path) -> None:
    """`serve --grpc-socket PATH --health-host 0.0.0.0 --health-port N`, the manifests' pod:
    ext_proc and the access log only on the socket (its file's mode lets the pod's group
    in); on the health port grpc.health.v1 answers and nothing else does (no usage can be
    reported there). A second sidecar on the same socket is refused."""
    socket_path = tmp_path / "grpc.sock"
    sidecar = Sidecar(
        _policy(tmp_path),
        metrics_port=None,
        admin_address=None,
        exact_tokenizer=False,
        grpc_socket=socket_path,
        health_port=0,
        health_host="127.0.0.1",
    )
    address = await sidecar.start()
    assert address.grpc == f"unix:{socket_path}" and address.health_port is not None
    try:
        assert socket_path.stat().st_mode & 0o777 == 0o660
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=10)
            await call.write(_headers_message("/v1/chat/completions", "sk-demo-standard", b"{}"))
            reply = await call.read()
            assert isinstance(reply, pb.ProcessingResponse) and reply.HasField("request_headers")
            await call.done_writing()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{address.health_port}") as channel:
            assert await statuses(channel) == dict.fromkeys(PICKER_SERVICES, SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as processed:
                await pb_grpc.ExternalProcessorStub(channel).Process(timeout=10).read()
            with pytest.raises(grpc.aio.AioRpcError) as reported:
                await als_pb2_grpc.AccessLogServiceStub(channel).StreamAccessLogs(timeout=10)
            for refused in (processed, reported):
                assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(PortTaken, match="another process listens there"):
            claim_socket(socket_path, "a second sidecar")
    finally:
        await sidecar.stop(grace_s=0.5)
    claim_socket(socket_path, "a sidecar after it")  # gone or stale: no longer refused


async def test_an_admin_socket_another_process_listens_on_is_refused(tmp_path: Path) -> None:
    """grpcio unlinks a socket file before it binds: a second sidecar given the first's
    admin socket would have taken the operator's drills and reloads from it."""
    path = tmp_path / "admin.sock"
    holder = socket.socket(socket.AF_UNIX)
    holder.bind(str(path))
    holder.listen()
    sidecar = Sidecar(
        _policy(tmp_path), grpc_port=0, metrics_port=None, admin_address=f"unix:{path}"
    )
    try:
        with pytest.raises(PortTaken, match=r"the admin API\): another process listens there"):
            await sidecar.start()
        # The holder still has its socket: nothing unlinked it.
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(path))
        probe.close()
    finally:
        await sidecar.stop(grace_s=0.5)
        holder.close()


async def test_a_unix_socket_that_cannot_be_made_fails_loudly(tmp_path: Path) -> None:
    """grpcio answers a socket path in a missing folder with 0, not an error: the admin API
    or ext_proc would have said it listened where nothing did."""
    server = grpc.aio.server()
    with pytest.raises(PortTaken, match="its folder is missing or not writable"):
        bind(server, f"unix:{tmp_path}/no/such/folder/admin.sock", "the admin API")
