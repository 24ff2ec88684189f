"""Who may call the admin API: a bearer token, or the Unix socket's file permissions.

What lives here: `AdminAuth`, a gRPC server interceptor the admin server runs before any
servicer, and `admin_token()`, which reads the token. The rule:
- a token is configured (`SLOGATE_ADMIN_TOKEN_FILE` names a file holding it, e.g. a
  mounted Secret): every admin call needs `authorization: Bearer <token>`, on TCP and on a
  Unix socket alike; anything else is UNAUTHENTICATED;
- no token, a Unix socket: every call is allowed (whoever can open the socket file may
  change the gateway; keep it 0600 / in a 0700 directory);
- no token, TCP: reads, drills and reloads work as before, but key changes (AddKey,
  RevokeKey, RotateKey) are refused: minting keys on an unauthenticated port is not offered.
The token is read once at start (restart to change it) and compared in constant time.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

TOKEN_FILE_ENV = "SLOGATE_ADMIN_TOKEN_FILE"
_KEY_CHANGES = frozenset(
    f"/slogate.admin.v1.KeyAdmin/{name}" for name in ("AddKey", "RevokeKey", "RotateKey")
)


class AdminTokenError(ValueError):
    """The configured token file cannot be used."""


def admin_token(environ: dict[str, str] | None = None) -> str | None:
    """The admin token from the file `SLOGATE_ADMIN_TOKEN_FILE` names; None: not set."""
    path = (environ if environ is not None else dict(os.environ)).get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise AdminTokenError(f"{TOKEN_FILE_ENV}={path}: {error.strerror}") from None
    if len(token) < 16:
        raise AdminTokenError(f"{TOKEN_FILE_ENV}={path}: the token needs 16 characters or more")
    return token


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
        method = handler_call_details.method
        if self._expected is not None:
            given = ""
            for name, value in handler_call_details.invocation_metadata or ():
                if name == "authorization":
                    given = value if isinstance(value, str) else value.decode()
            if not hmac.compare_digest(given.encode(), self._expected):
                return _refusal(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "the admin API needs its token: authorization: Bearer <token> "
                    f"(slogate: --token-file or {TOKEN_FILE_ENV})",
                )
        elif not self._unix_socket and method in _KEY_CHANGES:
            return _refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "key changes on a TCP admin address need a token: start the sidecar with "
                f"{TOKEN_FILE_ENV} naming a file that holds one, or serve the admin API on "
                "a Unix socket (--admin-address unix:/path)",
            )
        return await continuation(handler_call_details)
