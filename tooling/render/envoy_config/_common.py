"""Small pieces every part of the generated Envoy configuration uses."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.type.v3 as envoy_type
import envoy_data_plane.google.protobuf as pb


class FilterProfile(StrEnum):
    """Which filters the listener runs; only benchmarks use anything but SLOGATE."""

    SLOGATE = "slogate"  # ext_proc + usage tap + access log to the sidecar
    EXT_PROC_ONLY = "ext_proc_only"  # the same ext_proc filter and modes, nothing else
    PLAIN = "plain"  # Envoy alone: router only


@dataclass(frozen=True, slots=True)
class EnvoyPorts:
    listen_port: int = 10000
    admin_port: int = 9901
    sidecar_port: int = 50051
    host: str = "127.0.0.1"  # the sidecar and the admin interface: loopback only
    listen_host: str | None = None  # the client listener; None: `host` (0.0.0.0 in a pod)


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


def _http_status(code: int) -> Any:

    return envoy_type.HttpStatus(code=envoy_type.StatusCode(code))
