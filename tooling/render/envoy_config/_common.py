"""Small pieces every part of the generated Envoy configuration uses."""

from __future__ import annotations

import datetime as dt
from typing import Any

import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.type.v3 as envoy_type
import envoy_data_plane.google.protobuf as pb


def _duration_ms(ms: float) -> dt.timedelta:
    return dt.timedelta(milliseconds=ms)


def _typed(name: str, message: Any) -> dict[str, Any]:
    return {"name": name, "typed_config": pb.Any.pack(message)}


def _header(key: str, value: str) -> core.HeaderValueOption:
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, value=value),
        append_action=core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _address(host: str, port: int) -> core.Address:
    return core.Address(socket_address=core.SocketAddress(address=host, port_value=port))


def _pipe(path: str) -> core.Address:
    """A Unix socket (Envoy calls it a pipe), such as `slogate serve --grpc-socket`'s."""
    return core.Address(pipe=core.Pipe(path=path))


def _http_status(code: int) -> Any:

    return envoy_type.HttpStatus(code=envoy_type.StatusCode(code))
