"""Who may call the admin API: a bearer token on TCP, the socket file's permissions on a
Unix socket.

What lives here: `ADMIN_METHODS`, every admin RPC classified as a read or a change (the one
place that says which; a test holds it to the protos' full method list, and a method
missing from it is treated as a change), `AdminAuth`, the gRPC server interceptor the admin
server runs before any servicer, `admin_token()`, which reads the sidecar's token, and
`ensure_token_file()`, which makes a token file (random, 0600) where none is yet (`slogate
up`, `slogate admin-token` in the pod), and `secure_unix_socket()`, which makes a Unix socket
file 0600. The rule:
- reads (Status, Keys, ListKeys, Tenants) never need the token: they change nothing, and
  dashboards and `slogate status` keep working however the token is handled;
- changes (Drill, ReloadPolicy, Drain, AddKey, RevokeKey, RotateKey) need
  `authorization: Bearer <token>` whenever a token is configured (`SLOGATE_ADMIN_TOKEN_FILE`
  names a file holding it: `slogate up` writes one, the manifests mount one), on TCP and on
  a Unix socket alike; a wrong or missing token is UNAUTHENTICATED;
- no token, a Unix socket: changes are allowed. Whoever can open the socket file
  administers the gateway, so the file is made 0600 (its owner only) as it is bound; keep
  its directory the sidecar user's too;
- no token, TCP: changes are refused (UNAUTHENTICATED, saying how to configure a token),
  and the sidecar logs the same once at start. Loopback is no boundary in a pod (every
  container of the pod shares it), so nothing on TCP changes the gateway unauthenticated.
  The sidecar still starts: it sits in the request path, and an admin-plane setting must
  not take the data plane down (a refused start would turn a missing token file into an
  outage, where a refused drill only asks for the file).
The token is read once at start (restart to change it) and compared in constant time.
"""

from __future__ import annotations

import enum
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

TOKEN_FILE_ENV = "SLOGATE_ADMIN_TOKEN_FILE"
MIN_TOKEN_CHARS = 16


class Access(enum.Enum):
    READ = "read"
    CHANGE = "change"


_PACKAGE = "slogate.admin.v1"
# Every RPC the admin server serves (protos/extproc/adminpb/*.proto), by its gRPC path.
ADMIN_METHODS: Mapping[str, Access] = {
    f"/{_PACKAGE}.{service}/{method}": access
    for service, method, access in (
        ("Admin", "Status", Access.READ),
        ("Admin", "Keys", Access.READ),
        ("Admin", "Drill", Access.CHANGE),
        ("Admin", "ReloadPolicy", Access.CHANGE),
        ("Admin", "Drain", Access.CHANGE),
        ("KeyAdmin", "AddKey", Access.CHANGE),
        ("KeyAdmin", "RevokeKey", Access.CHANGE),
        ("KeyAdmin", "RotateKey", Access.CHANGE),
        ("KeyAdmin", "ListKeys", Access.READ),
        ("TenantAdmin", "Tenants", Access.READ),
    )
}


def access_of(method: str) -> Access:
    """What calling `method` (a gRPC path) does; one nobody classified counts as a change."""
    return ADMIN_METHODS.get(method, Access.CHANGE)


class AdminTokenError(ValueError):
    """The configured token file cannot be used."""


def admin_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The admin token from the file `SLOGATE_ADMIN_TOKEN_FILE` names; None: not set."""
    path = (environ if environ is not None else os.environ).get(TOKEN_FILE_ENV)
    if not path:
        return None
    return read_token(Path(path), TOKEN_FILE_ENV + "=")


def read_token(path: Path, what: str = "") -> str:
    """The token a token file holds (16 characters or more), or AdminTokenError."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise AdminTokenError(f"{what}{path}: {error.strerror}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminTokenError(f"{what}{path}: the token needs {MIN_TOKEN_CHARS} characters or more")
    return token


def ensure_token_file(path: Path) -> Path:
    """`path`, holding a token: the one already there (checked: AdminTokenError), or a new
    random one (256 bits) in a file only its owner may read, its folder made 0700 when this
    makes it."""
    if path.exists():
        read_token(path)
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return path


NO_TOKEN_ON_TCP = (
    "this admin API listens on TCP without a token, so it changes nothing (drills, reloads, "
    f"drains and key changes are refused; reads work): start the sidecar with {TOKEN_FILE_ENV} "
    "naming a file that holds a token of 16+ characters (`slogate admin-token PATH` makes one; "
    "`slogate up` and the manifests do it themselves), or serve the admin API on a Unix "
    "socket (--admin-address unix:/path)"
)
WRONG_TOKEN = (
    "this admin call changes the gateway and needs the admin token: authorization: Bearer "
    f"<token> (the slogate CLI sends it from --token-file, {TOKEN_FILE_ENV}, or the file "
    "`slogate up` writes)"
)


def secure_unix_socket(address: str) -> None:
    """Make the socket file of `unix:PATH` readable and writable by its owner only (connecting
    needs write permission): with no token, the file's permissions are the authentication."""
    if address.startswith("unix:"):  # (an abstract socket, unix-abstract:, has no file)
        os.chmod(address.removeprefix("unix:").removeprefix("//"), 0o600)


def _refusal(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    return grpc.unary_unary_rpc_method_handler(refuse)


class AdminAuth(grpc.aio.ServerInterceptor):
    def __init__(self, token: str | None, unix_socket: bool) -> None:
        self._expected = f"Bearer {token}".encode() if token is not None else None
        self._unix_socket = unix_socket

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if access_of(handler_call_details.method) is Access.READ:
            return await continuation(handler_call_details)
        if self._expected is None:
            if self._unix_socket:
                return await continuation(handler_call_details)
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, NO_TOKEN_ON_TCP)
        given = ""
        for name, value in handler_call_details.invocation_metadata or ():
            if name == "authorization":
                given = value if isinstance(value, str) else value.decode()
        if not hmac.compare_digest(given.encode(), self._expected):
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, WRONG_TOKEN)
        return await continuation(handler_call_details)
