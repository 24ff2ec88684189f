"""The sidecar's listeners: how its gRPC and /metrics servers are built and bound.

What lives here: `start_ext_proc` (the server Envoy calls: ext_proc, the access log,
grpc.health.v1), `PortTaken` and `bind` (a taken port fails loudly, naming what wanted it),
`grpc_options` (message limits, keepalive, port sharing between workers), and the admin
API's server, a worker's private server and the /metrics endpoint. Each starts its server
and registers its stop, beside the start, on the exit stack it is given: the composition
root (extproc.runtime.sidecar) stops them in the reverse of the order it started them. (A
stack's callbacks, not generator-based context managers: a sidecar that was never stopped
must not have its servers stopped by the garbage collector or the loop's shutdown.) Which
servicers go on which server, and how a port is taken, are told here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from http.server import HTTPServer

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry, start_http_server

from budget.spend_store import SpendStore
from extproc.adminpb import admin_pb2_grpc, tenants_pb2_grpc
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2_grpc
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from extproc.runtime.parts import Observers, RequestPath
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.workers import Siblings, WorkerSlot
from extproc.service.access_log import AccessLogService, OutcomeRecorder
from extproc.service.admin import AdminService
from extproc.service.admin_auth import AdminAuth, admin_token
from extproc.service.ext_proc import ExternalProcessorService
from extproc.service.key_admin import KeyAdminService, KeyWrites
from extproc.service.metrics import SidecarMetrics
from extproc.service.tenant_admin import TenantAdminService

# grpcio limits its messages to 4 MiB by default; a buffered body is one message.
GRPC_MESSAGE_SLACK_BYTES = 1 << 20


class PortTaken(OSError):
    """A port the sidecar must listen on is taken (by another process, most likely)."""


def bind(server: grpc.aio.Server, address: str, what: str) -> int:
    """Bind `address` for `what`, or raise PortTaken naming both (grpcio raises a bare
    RuntimeError, or returns 0, depending on its version)."""
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0 and not address.startswith("unix:"):
        raise PortTaken(f"cannot listen on {address} ({what}): the address is in use")
    return bound


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
) -> int:
    """The server Envoy calls: ext_proc, the access log and grpc.health.v1, started on
    `address` and SERVING; returns the port it bound. On the way out NOT_SERVING, and the
    streams in flight finish within `grace_s()` while new ones are refused."""
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
    # grpc.health.v1 for Kubernetes probes: SERVING once started, NOT_SERVING on stop.
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = bind(server, address, "the sidecar's gRPC port")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def drain() -> None:
        await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.stop(grace_s())

    exits.push_async_callback(drain)
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
    # Who may call it: a token, or a Unix socket's permissions (admin_auth).
    auth = AdminAuth(admin_token(), address.startswith("unix:"))
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=[auth])
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    admin_pb2_grpc.add_KeyAdminServicer_to_server(KeyAdminService(keys), server)
    tenants_pb2_grpc.add_TenantAdminServicer_to_server(
        TenantAdminService(policy, spend, wall_clock), server
    )
    bound = bind(server, address, "the admin API")
    await server.start()
    exits.push_async_callback(server.stop, 1.0)
    if address.startswith("unix:"):
        return address
    return f"{address.rsplit(':', 1)[0]}:{bound}"
