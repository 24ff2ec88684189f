"""Who may call the admin API (extproc.service.admin_auth), on a real in-process gRPC server:
a configured token is needed on every call; without one, a TCP address may not change keys
and a Unix socket may."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.service.admin_auth import AdminAuth, AdminTokenError, admin_token
from extproc.service.key_admin import KeyAdminService
from policy.domain import hash_api_key

TOKEN = "a-long-enough-admin-token"


async def codes(
    address: str, auth: AdminAuth, metadata: tuple[tuple[str, str], ...] | None
) -> dict[str, grpc.StatusCode]:
    server = grpc.aio.server(interceptors=[auth])
    pb_grpc.add_KeyAdminServicer_to_server(KeyAdminService(None), server)
    port = server.add_insecure_port(address)
    await server.start()
    target = address if address.startswith("unix:") else f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(target)
    stub = pb_grpc.KeyAdminStub(channel)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "list": lambda: stub.ListKeys(pb.ListKeysRequest(), metadata=metadata),
        "add": lambda: stub.AddKey(
            pb.AddKeyRequest(key_sha256=hash_api_key("k"), tenant="t"), metadata=metadata
        ),
    }
    found: dict[str, grpc.StatusCode] = {}
    try:
        for name, call in calls.items():
            try:
                await call()
                found[name] = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                found[name] = error.code()
    finally:
        await channel.close()
        await server.stop(None)
    return found


U, OK, NO_STORE = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OK,
    grpc.StatusCode.FAILED_PRECONDITION,  # past authentication: this server has no key store
)


@pytest.mark.parametrize(
    ("token", "given", "expected"),
    [
        (TOKEN, None, {"list": U, "add": U}),
        (TOKEN, "Bearer wrong-token-of-some-length", {"list": U, "add": U}),
        (TOKEN, f"Basic {TOKEN}", {"list": U, "add": U}),
        (TOKEN, f"Bearer {TOKEN}", {"list": OK, "add": NO_STORE}),
        (None, None, {"list": OK, "add": U}),  # TCP without a token: no key changes
    ],
)
def test_tcp_admin_calls_need_the_token(
    token: str | None, given: str | None, expected: dict[str, grpc.StatusCode]
) -> None:
    metadata = (("authorization", given),) if given is not None else None
    found = asyncio.run(codes("127.0.0.1:0", AdminAuth(token, unix_socket=False), metadata))
    assert found == expected


def test_a_unix_socket_needs_no_token_unless_one_is_set(tmp_path: Path) -> None:
    socket = f"unix:{tmp_path}/admin.sock"
    assert asyncio.run(codes(socket, AdminAuth(None, unix_socket=True), None)) == {
        "list": OK,
        "add": NO_STORE,
    }
    assert asyncio.run(codes(socket, AdminAuth(TOKEN, unix_socket=True), None)) == {
        "list": U,
        "add": U,
    }


def test_the_token_file(tmp_path: Path) -> None:
    assert admin_token({}) is None
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    assert admin_token({"SLOGATE_ADMIN_TOKEN_FILE": str(path)}) == TOKEN
    path.write_text("short")
    with pytest.raises(AdminTokenError, match="16 characters"):
        admin_token({"SLOGATE_ADMIN_TOKEN_FILE": str(path)})
    with pytest.raises(AdminTokenError, match="No such file"):
        admin_token({"SLOGATE_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})
