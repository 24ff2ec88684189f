"""Who may call the admin API (extproc.service.admin_auth): every admin RPC classified as
a read or a change (held to the protos' full method list), the rule on a real in-process
gRPC server, and a real sidecar's admin API on TCP and on a Unix socket: a drill without
the token is refused and the breaker does not move; reads need no token; a Unix socket
file is 0600 and needs none."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.runtime.sidecar import Sidecar
from extproc.service import admin_client
from extproc.service.admin_auth import (
    ADMIN_METHODS,
    NO_TOKEN_ON_TCP,
    TOKEN_FILE_ENV,
    WRONG_TOKEN,
    Access,
    AdminAuth,
    AdminTokenError,
    access_of,
    admin_token,
    ensure_token_file,
)
from extproc.service.key_admin import KeyAdminService
from policy.domain import hash_api_key
from tests.support.stack import EXAMPLE_POLICY, ROOT

TOKEN = "a-long-enough-admin-token"
PROTOS = ROOT / "protos" / "extproc" / "adminpb"


def proto_methods() -> set[str]:
    """Every RPC of every admin proto file, as its gRPC path, read from the .proto text: a
    new RPC, service or file shows up here whether or not it was compiled."""
    found = set()
    for proto in sorted(PROTOS.glob("*.proto")):
        text = proto.read_text(encoding="utf-8")
        (package,) = re.findall(r"^package\s+([\w.]+);", text, re.M)
        for service, body in re.findall(r"^service\s+(\w+)\s*\{(.*?)^\}", text, re.M | re.S):
            found |= {f"/{package}.{service}/{rpc}" for rpc in re.findall(r"rpc\s+(\w+)", body)}
    return found


def test_every_admin_rpc_is_classified_and_the_changes_are_the_ones_that_change() -> None:
    assert len(proto_methods()) >= 10  # the parse found the services
    assert set(ADMIN_METHODS) == proto_methods()
    changes = {path.rsplit("/", 1)[1] for path, a in ADMIN_METHODS.items() if a is Access.CHANGE}
    assert changes == {"Drill", "ReloadPolicy", "Drain", "AddKey", "RevokeKey", "RotateKey"}
    assert access_of("/slogate.admin.v1.Admin/SomethingNew") is Access.CHANGE  # fails closed


async def codes(
    address: str, auth: AdminAuth, metadata: tuple[tuple[str, str], ...] | None
) -> dict[str, tuple[grpc.StatusCode, str]]:
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
    found: dict[str, tuple[grpc.StatusCode, str]] = {}
    try:
        for name, call in calls.items():
            try:
                await call()
                found[name] = (grpc.StatusCode.OK, "")
            except grpc.aio.AioRpcError as error:
                found[name] = (error.code(), error.details() or "")
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
    ("token", "given", "add", "said"),
    [
        (TOKEN, None, U, WRONG_TOKEN),
        (TOKEN, "Bearer wrong-token-of-some-length", U, WRONG_TOKEN),
        (TOKEN, f"Basic {TOKEN}", U, WRONG_TOKEN),
        (TOKEN, f"Bearer {TOKEN}", NO_STORE, None),
        (None, None, U, NO_TOKEN_ON_TCP),  # TCP without a token: no changes at all
        (None, f"Bearer {TOKEN}", U, NO_TOKEN_ON_TCP),
    ],
)
def test_on_tcp_changes_need_the_token_and_reads_do_not(
    token: str | None, given: str | None, add: grpc.StatusCode, said: str | None
) -> None:
    metadata = (("authorization", given),) if given is not None else None
    found = asyncio.run(codes("127.0.0.1:0", AdminAuth(token, unix_socket=False), metadata))
    assert found["list"] == (OK, "")
    assert found["add"][0] is add
    if said is not None:
        assert found["add"][1] == said


def test_a_unix_socket_allows_changes_without_a_token_unless_one_is_set(tmp_path: Path) -> None:
    socket = f"unix:{tmp_path}/admin.sock"
    found = asyncio.run(codes(socket, AdminAuth(None, unix_socket=True), None))
    assert {name: code for name, (code, _) in found.items()} == {"list": OK, "add": NO_STORE}
    found = asyncio.run(codes(socket, AdminAuth(TOKEN, unix_socket=True), None))
    assert {name: code for name, (code, _) in found.items()} == {"list": OK, "add": U}


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


def test_a_made_token_file_is_random_its_owners_only_and_kept(tmp_path: Path) -> None:
    first = ensure_token_file(tmp_path / "state" / "slogate" / "admin-token")
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    token = first.read_text().strip()
    assert len(token) >= 40  # 256 bits, URL-safe
    assert ensure_token_file(first).read_text().strip() == token  # a second `up` keeps it
    other = ensure_token_file(tmp_path / "other")
    assert other.read_text().strip() != token


# -- a real sidecar's admin API -------------------------------------------------------------


@pytest.fixture
async def sidecar(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Sidecar, str]]:
    """A sidecar in this process with its admin API on `request.param`: "tcp" (loopback)
    or "unix" (a socket in tmp_path); SLOGATE_ADMIN_TOKEN_FILE as the test set it before."""
    address = "127.0.0.1:0" if request.param == "tcp" else f"unix:{tmp_path}/admin.sock"
    started = Sidecar(
        EXAMPLE_POLICY,
        grpc_port=0,
        metrics_port=None,
        admin_address=address,
        exact_tokenizer=False,
    )
    bound = await started.start()
    assert bound.admin is not None
    try:
        yield started, bound.admin
    finally:
        await started.stop(grace_s=0.1)


async def level(admin: str, pool: str = "default") -> int:
    """The pool's breaker level, read back without any token (a read)."""
    channel, stub = admin_client.stub(admin, None)
    try:
        status = await stub.Status(pb.StatusRequest(), timeout=10)
    finally:
        await channel.close()
    return next(b.level for b in status.breakers if b.pool == pool)


async def drill(admin: str, token: str | None) -> pb.DrillReply:
    async with admin_client.channel(admin, token) as channel:
        request = pb.DrillRequest(pool="default", level=3, minutes=1)
        reply: pb.DrillReply = await pb_grpc.AdminStub(channel).Drill(request, timeout=10)
        return reply


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # no default token file either


@pytest.mark.parametrize("sidecar", ["tcp"], indirect=True)
async def test_a_drill_over_tcp_without_a_token_is_refused_and_the_breaker_stays(
    no_token: None, sidecar: tuple[Sidecar, str]
) -> None:
    _, admin = sidecar
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await drill(admin, TOKEN)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == NO_TOKEN_ON_TCP
    assert TOKEN_FILE_ENV in NO_TOKEN_ON_TCP and "unix:" in NO_TOKEN_ON_TCP  # says how
    assert await level(admin) == 0


@pytest.fixture
def token_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    path = ensure_token_file(tmp_path / "admin-token")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    return path.read_text().strip()


@pytest.mark.parametrize("sidecar", ["tcp"], indirect=True)
async def test_a_drill_over_tcp_needs_the_configured_token(
    token_set: str, sidecar: tuple[Sidecar, str]
) -> None:
    _, admin = sidecar
    for wrong in (None, "wrong-token-of-enough-length"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await drill(admin, wrong)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == WRONG_TOKEN
        assert await level(admin) == 0
    assert (await drill(admin, token_set)).level == 3
    assert await level(admin) == 3


@pytest.mark.parametrize("sidecar", ["unix"], indirect=True)
async def test_a_unix_socket_is_its_owners_only_and_needs_no_token(
    no_token: None, sidecar: tuple[Sidecar, str]
) -> None:
    _, admin = sidecar
    mode = os.stat(admin.removeprefix("unix:")).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert (await drill(admin, None)).level == 3
    assert await level(admin) == 3
