"""The sidecar's listeners: how its gRPC and /metrics servers are built and bound.

What lives here: `start_ext_proc` (the server Envoy calls: ext_proc, the access log,
grpc.health.v1 with the endpoint picker protocol's service names; on a TCP address or a Unix
socket only the pod's containers can open), `ListenerTls` (its server certificate, and the
client CA of mutual TLS), `start_health` (grpc.health.v1 alone in plain text, for the
kubelet's probes: beside a TLS port, or on the pod's address while ext_proc stays inside the
pod), `PortTaken` and `bind` (a taken port or a live socket fails loudly, naming what wanted
it), `grpc_options` (message limits,
keepalive, port sharing between workers), and the admin API's server, a worker's private
server and the /metrics endpoint. Each starts its server
and registers its stop, beside the start, on the exit stack it is given: the composition
root (extproc.runtime.sidecar) stops them in the reverse of the order it started them. (A
stack's callbacks, not generator-based context managers: a sidecar that was never stopped
must not have its servers stopped by the garbage collector or the loop's shutdown.) Which
servicers go on which server, and how a port is taken, are told here.
"""

from __future__ import annotations

import logging
import socket
import stat
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from http.server import HTTPServer
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry, start_http_server

from budget.spend_store import SpendStore
from extproc.adminpb import admin_pb2_grpc, tenants_pb2_grpc
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2_grpc
from extproc.envoypb.envoy.service.ext_proc.v3 import (
    external_processor_pb2,
    external_processor_pb2_grpc,
)
from extproc.runtime.parts import Observers, RequestPath
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.workers import Siblings, WorkerSlot
from extproc.service.access_log import AccessLogService, OutcomeRecorder
from extproc.service.admin import AdminService
from extproc.service.admin_auth import (
    NO_TOKEN_ON_TCP,
    AdminAuth,
    admin_token,
    secure_unix_socket,
)
from extproc.service.ext_proc import ExternalProcessorService
from extproc.service.key_admin import KeyAdminService, KeyWrites
from extproc.service.metrics import SidecarMetrics
from extproc.service.tenant_admin import TenantAdminService

# grpcio limits its messages to 4 MiB by default; a buffered body is one message.
GRPC_MESSAGE_SLACK_BYTES = 1 << 20

# The health services the endpoint picker protocol names (the Gateway API inference
# extension's proposal 004), beside "" (the whole server, what the kubelet's gRPC probe
# asks by default). `liveness`: the process answers; stays SERVING while it drains, so a
# draining sidecar is not restarted. `readiness` and the ext_proc service: it is ready to
# decide (the policy loaded, the tokenizer, the engines discovered, the request path warm:
# all done before the server starts) and not stopping.
LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = "readiness"
EXT_PROC_SERVICE = external_processor_pb2.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
READY_SERVICES = ("", READINESS_SERVICE, EXT_PROC_SERVICE)

log = logging.getLogger("slogate.admin")


@dataclass(frozen=True, slots=True)
class ListenerTls:
    """TLS on the sidecar's gRPC port: its certificate chain and key (PEM files), and, for
    mutual TLS, the CA its callers' client certificates must chain to (None: any caller
    that trusts the server's certificate may call). Read once at start."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )


class PortTaken(OSError):
    """A port the sidecar must listen on is taken (by another process, most likely)."""


def bind(
    server: grpc.aio.Server,
    address: str,
    what: str,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Bind `address` for `what` (with TLS when `credentials`), or raise PortTaken naming
    both (grpcio raises a bare RuntimeError, or returns 0, depending on its version)."""
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        # grpcio says the same for a certificate or key it cannot use (its log says which).
        cause = (
            "in use, or the TLS certificate and key are not a PEM pair" if credentials else "in use"
        )
        if address.startswith("unix:"):
            cause = "not creatable: its folder is missing or not writable"
        raise PortTaken(f"cannot listen on {address} ({what}): the address is {cause}")
    return bound


# Connecting to a Unix socket needs write permission on it. Envoy beside the sidecar runs
# as another user (its image's `envoy`) in the pod's fsGroup: the group may connect, others
# may not (grpcio leaves the umask's 0755: only the sidecar's own user could).
SOCKET_MODE = 0o660


def unix_socket_path(address: str) -> Path | None:
    """The file of a `unix:PATH` (or `unix:///PATH`) address; None for any other address."""
    if not address.startswith("unix:"):
        return None
    return Path(address.removeprefix("unix:").removeprefix("//"))


def claim_socket(path: Path, what: str) -> None:
    """Refuse a Unix socket path another process listens on: grpcio unlinks a socket file
    before it binds, so a second sidecar on the path would silently take it from a live
    one. A stale socket (nothing answers) is left for grpcio to replace; anything else
    there is refused."""
    if not path.exists():
        return
    if not stat.S_ISSOCK(path.stat().st_mode):
        raise PortTaken(f"cannot listen on unix:{path} ({what}): a file that is no socket is there")
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        return  # stale: its process is gone
    finally:
        probe.close()
    raise PortTaken(f"cannot listen on unix:{path} ({what}): another process listens there")


def grpc_options(policy: PolicyHolder, worker: WorkerSlot | None) -> list[tuple[str, int]]:
    limit = policy().max_body_bytes + GRPC_MESSAGE_SLACK_BYTES
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        # Envoy pings its HTTP/2 upstreams; grpcio would answer with GOAWAY otherwise.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.http2.max_ping_strikes", 0),
        # Two sidecars on one port must fail loudly, not silently share traffic — unless
        # they are the workers of one `serve --workers N`, which share it on purpose.
        ("grpc.so_reuseport", 1 if worker is not None else 0),
    ]


async def start_ext_proc(
    exits: AsyncExitStack,
    *,
    address: str,
    options: list[tuple[str, int]],
    path: RequestPath,
    observers: Observers,
    metrics: SidecarMetrics,
    siblings: Siblings | None,
    health: HealthServicer,
    message_timeout_ms: int,
    grace_s: Callable[[], float],
    tls: ListenerTls | None = None,
) -> int:
    """The server Envoy calls: ext_proc, the access log and grpc.health.v1, started on
    `address` (host:port, or unix:/path with SOCKET_MODE; TLS with `tls`) and SERVING;
    returns the port it bound (0 for a Unix socket). On the way out the
    ready services go NOT_SERVING (liveness stays SERVING while the process answers), and
    the streams in flight finish within `grace_s()` while new ones are refused."""
    server = grpc.aio.server(options=options)
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        ExternalProcessorService(
            path.decider,
            metrics,
            observers.watching(),
            message_timeout_ms=message_timeout_ms,
            ends=path.recorder,
        ),
        server,
    )
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(
        AccessLogService(path.recorder, siblings), server
    )
    # grpc.health.v1 for Kubernetes probes and gateways: SERVING once started, the ready
    # services NOT_SERVING on stop.
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    credentials = tls.credentials() if tls is not None else None
    what = "the sidecar's gRPC port"
    socket_path = unix_socket_path(address)
    if socket_path is not None:
        claim_socket(socket_path, what)
    port = bind(server, address, what, credentials)
    if socket_path is not None:
        socket_path.chmod(SOCKET_MODE)  # before start: Envoy (the group) can connect at once
        port = 0
    await server.start()
    for service in (LIVENESS_SERVICE, *READY_SERVICES):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def drain() -> None:
        for service in READY_SERVICES:
            await health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.stop(grace_s())

    exits.push_async_callback(drain)
    return port


async def start_health(
    exits: AsyncExitStack,
    *,
    address: str,
    options: list[tuple[str, int]],
    health: HealthServicer,
) -> int:
    """grpc.health.v1 alone, in plain text, answering what the gRPC port's health answers
    (the same servicer): the kubelet's gRPC probe speaks no TLS. Returns the port it bound."""
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = bind(server, address, "the sidecar's health port")
    await server.start()
    exits.push_async_callback(server.stop, 0.5)
    return port


def start_metrics(
    exits: AsyncExitStack, *, port: int, host: str, registry: CollectorRegistry
) -> int:
    """The /metrics HTTP endpoint, or PortTaken; returns the port it bound."""
    try:
        httpd, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise PortTaken(f"cannot listen on {host}:{port} (/metrics): {error.strerror}") from None
    exits.callback(_close_http, httpd)
    return int(httpd.server_port)


def _close_http(httpd: HTTPServer) -> None:
    httpd.shutdown()
    httpd.server_close()


async def start_private(
    exits: AsyncExitStack,
    *,
    worker: WorkerSlot,
    options: list[tuple[str, int]],
    recorder: OutcomeRecorder,
    admin: AdminService,
) -> None:
    """A worker's own Unix socket: the entries its siblings received for its requests,
    and the drills and reloads worker 0's admin API passes on."""
    server = grpc.aio.server(options=options)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(AccessLogService(recorder), server)
    admin_pb2_grpc.add_AdminServicer_to_server(admin.alone(), server)
    server.add_insecure_port(worker.socket(worker.index))
    await server.start()
    exits.push_async_callback(server.stop, 1.0)


async def start_admin(
    exits: AsyncExitStack,
    *,
    address: str,
    admin: AdminService,
    keys: KeyWrites | None,
    policy: PolicyHolder,
    spend: SpendStore | None,
    wall_clock: Callable[[], float],
) -> str:
    """The admin API on its own server: loopback or a Unix socket, never the pod IP.
    Returns the address it listens on."""
    # Who may change anything: the token's holder, or a Unix socket's owner (admin_auth).
    token = admin_token()
    unix_socket = address.startswith("unix:")
    if token is None and not unix_socket:
        log.warning("admin API %s: %s", address, NO_TOKEN_ON_TCP)
    auth = AdminAuth(token, unix_socket)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=[auth])
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    admin_pb2_grpc.add_KeyAdminServicer_to_server(KeyAdminService(keys), server)
    tenants_pb2_grpc.add_TenantAdminServicer_to_server(
        TenantAdminService(policy, spend, wall_clock), server
    )
    admin_socket = unix_socket_path(address)
    if admin_socket is not None:  # grpcio would unlink a live sidecar's admin socket
        claim_socket(admin_socket, "the admin API")
    bound = bind(server, address, "the admin API")
    if unix_socket:  # 0600 before it answers anyone
        secure_unix_socket(address)
    await server.start()
    exits.push_async_callback(server.stop, 1.0)
    if address.startswith("unix:"):
        return address
    return f"{address.rsplit(':', 1)[0]}:{bound}"
