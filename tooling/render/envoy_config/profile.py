"""What a bootstrap is rendered for: the ports it listens on and reaches the sidecar and
its admin interface at (`EnvoyPorts`), and which filters its listener runs (`FilterProfile`).
The callers' inputs, apart from the helpers the pieces share (`_common`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FilterProfile(StrEnum):
    """Which filters the listener runs; only benchmarks use anything but SLOGATE."""

    SLOGATE = "slogate"  # ext_proc + usage tap + access log to the sidecar
    EXT_PROC_ONLY = "ext_proc_only"  # the same ext_proc filter and modes, nothing else
    PLAIN = "plain"  # Envoy alone: router only


@dataclass(frozen=True, slots=True)
class SidecarTls:
    """Envoy's side of TLS to the sidecar's gRPC port (`slogate serve --tls-cert`): the CA
    the sidecar's certificate must chain to, the name it must carry (also sent as SNI; None:
    any certificate the CA signed), and Envoy's own client certificate for mutual TLS
    (`serve --tls-client-ca`). Paths as Envoy sees them."""

    ca_file: str
    server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class EnvoyPorts:
    listen_port: int = 10000
    admin_port: int = 9901
    sidecar_port: int = 50051
    host: str = "127.0.0.1"  # the sidecar and the admin interface: loopback only
    listen_host: str | None = None  # the client listener; None: `host` (0.0.0.0 in a pod)
    sidecar_tls: SidecarTls | None = None  # None: plain text to the sidecar (loopback)
    # The sidecar's Unix socket (`serve --grpc-socket`), a pipe address; None: TCP at
    # host:sidecar_port.
    sidecar_socket: str | None = None
