"""The sidecar process: its composition root (`slogate serve` runs it: extproc.runtime.serve).

What lives here: `Sidecar`, which builds the named parts (extproc.runtime.parts: the
signals, the observers, the request path, the control loops; extproc.runtime.stores: the
stores) and runs them: `start` warms the request path up, then starts the servers
(extproc.runtime.grpc_servers) and the periodic loops (extproc.runtime.periodic); `stop`
undoes whatever was built and started, in the reverse order, from one exit stack on which
each part registered its undoing as it was built or started. It holds
no business rule: every formula lives in the module that owns the concept.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from grpc_health.v1 import health

from admission.regions import PeerRooms
from budget.region_demand import RegionDemand
from extproc.request.tokens.native import exact_counter
from extproc.runtime.grpc_servers import (
    ListenerTls,
    grpc_options,
    start_admin,
    start_ext_proc,
    start_health,
    start_metrics,
    start_private,
)
from extproc.runtime.key_store import build_key_store
from extproc.runtime.parts import build_control, build_observers, build_request_path, build_signals
from extproc.runtime.peer_probe import PeerProbe
from extproc.runtime.periodic import start_loops
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.region_agent import RegionAgent, pool_rooms
from extproc.runtime.region_store import InProcessRegionStore
from extproc.runtime.stores import build_stores
from extproc.runtime.warm_up import warm_up
from extproc.runtime.workers import Siblings, WorkerSlot
from extproc.service.metrics import SidecarMetrics

__all__ = ["Sidecar", "SidecarAddress"]


@dataclass(frozen=True, slots=True)
class SidecarAddress:
    host: str
    grpc_port: int
    metrics_port: int | None
    admin: str | None  # host:port or unix:path of the admin API
    health_port: int | None = None  # grpc.health.v1 alone, in plain text
    grpc_socket: Path | None = None  # ext_proc and the access log on this Unix socket

    @property
    def grpc(self) -> str:
        """Where Envoy reaches ext_proc and the access log: host:port or unix:/path."""
        if self.grpc_socket is not None:
            return f"unix:{self.grpc_socket}"
        return f"{self.host}:{self.grpc_port}"


class Sidecar:
    def __init__(
        self,
        policy_path: Path,
        host: str = "127.0.0.1",
        grpc_port: int = 50051,
        metrics_port: int | None = 9464,
        exact_tokenizer: bool = True,
        watch_interval_s: float = 1.0,
        metrics_host: str | None = None,
        admin_address: str | None = "127.0.0.1:50052",
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        worker: WorkerSlot | None = None,
        tls: ListenerTls | None = None,
        health_port: int | None = None,
        grpc_socket: Path | None = None,
        health_host: str | None = None,
        region: str | None = None,
        peer_rooms: PeerRooms | None = None,
    ) -> None:
        """`region`: this deployment's region (`slogate serve --region`; None: the
        policy's `regions.this`). `worker`: this process is one of `slogate serve --workers N`
        (extproc.runtime.workers). `tls`: the gRPC port speaks TLS; `health_port`: a
        plain-text port with grpc.health.v1 alone on `health_host` (default: `host`; the
        kubelet's probes speak no TLS and dial the pod's address); `grpc_socket`: ext_proc
        and the access log on this Unix socket instead of `host`:`grpc_port`; `peer_rooms`:
        the other regions' pools' room, which crossing reads (admission.crossing; None: as
        the region agent last heard from the global ledger; a test hands in its own)."""
        self.worker = worker
        # Injected for tests that run this object graph on a virtual clock beside the
        # simulator's (tests/sim/fleet/test_sidecar.py); a process uses the real ones.
        self.clock = clock or time.monotonic
        self._wall_clock = clock or time.time  # UTC: the spend budgets' day and month
        self.metrics = SidecarMetrics()
        self.policy = PolicyHolder(policy_path, self.metrics)
        # What is read only at start: policy.start_only.START_ONLY_SETTINGS.
        initial = self.policy()
        self.metrics.rerank_tenants(initial)  # the cap holds from the first request
        # What is built or started below and must be closed or stopped registers its undoing
        # here as it comes: `stop` runs them last first. Its order is the build order.
        self._exits = AsyncExitStack()
        # Counting settings take effect at start: the worker threads and the cache live on.
        executor = ThreadPoolExecutor(initial.counting.workers, "slogate-tokenizer")
        self._exits.callback(executor.shutdown, wait=False, cancel_futures=True)
        self.signals = build_signals(self.policy, self.metrics, self.clock)
        self.observers = build_observers(initial, self.metrics)
        self._exits.callback(self.observers.close)
        self.stores = build_stores(self.policy, self.metrics, self.clock, clock)
        self._exits.push_async_callback(self.stores.close)
        # Keys managed without editing the policy (key_store:), looked up before its keys.
        self.keys = build_key_store(self.policy, self.metrics.registry)
        if self.keys is not None:
            self._exits.push_async_callback(self.keys.close)
        self._exits.push_async_callback(self.stores.leave)  # the fleet's count, first
        # This replica's part in the region's lease of the global budgets (idle without
        # `regions:`); its pools' room, for the peers' crossing, read from the parts below.
        self.region = RegionAgent(
            policy=self.policy,
            store=self.stores.region or InProcessRegionStore(),
            demand=RegionDemand(),
            registry=self.metrics.registry,
            tenants=self.metrics.tenants,
            clock=self.clock,
            wall_clock=self._wall_clock,
            spend=self.stores.spend,
            pools=lambda: pool_rooms(
                self.policy(), self.signals.board, self.path.admission.kv.dispatcher.room
            ),
            region=region,
        )
        self.siblings = Siblings(worker) if worker is not None else None
        if self.siblings is not None:
            self._exits.push_async_callback(self.siblings.close)
        self.path = build_request_path(
            policy=self.policy,
            metrics=self.metrics,
            signals=self.signals,
            stores=self.stores,
            keys=self.keys,
            observers=self.observers,
            executor=executor,
            clock=self.clock,
            wall_clock=self._wall_clock,
            rng=rng or random.Random(),
            worker=worker,
            injected_clock=clock,
            region=self.region,
            peer_rooms=peer_rooms,
            region_name=region,
        )
        self.control = build_control(
            policy=self.policy,
            metrics=self.metrics,
            signals=self.signals,
            stores=self.stores,
            path=self.path,
            clock=self.clock,
            wall_clock=self._wall_clock,
            siblings=self.siblings,
            decision_log=self.observers.decision_log,
            region=self.region,
        )
        self._exact_executor = executor
        self._exact_tokenizer = exact_tokenizer
        self._host = host
        self._grpc_port = grpc_port
        self._metrics_port = metrics_port
        # Prometheus may need the pod address while ext_proc stays on loopback.
        self._metrics_host = metrics_host or host
        self._admin_address = admin_address
        self._tls = tls
        self._health_port = health_port
        self._health_host = health_host or host
        self._grpc_socket = grpc_socket
        self._watch_interval_s = watch_interval_s
        self._health = health.aio.HealthServicer()
        self._grace_s = 5.0  # how long stop lets the streams in flight finish
        self._region = region  # `slogate serve --region`: the peers are the others

    async def start(self) -> SidecarAddress:
        """Ready to serve: the tokenizer loaded, the engines and stored keys known and the
        request path warm before any server listens; the ext_proc server (and its health's
        SERVING) last, so that on stop it is the first to go and drains while the admin
        API, a worker's private socket and /metrics still answer; the loops after it.
        Started whole or not at all: a failure part way (a taken port, the first heartbeat)
        stops what already started, last first, before it is raised."""
        try:
            return await self._start()
        except BaseException:
            await self._exits.aclose()
            raise

    async def _start(self) -> SidecarAddress:
        bpe = None
        if self._exact_tokenizer:
            # Loaded before the servers start (~1 s), off the loop: no request is ever
            # counted by its byte bound only because the tokenizer was still loading.
            bpe = await asyncio.get_running_loop().run_in_executor(
                self._exact_executor, exact_counter, self.policy().counting.engine
            )
            self.path.counter.use(bpe)
        watch = self.signals.engine_watch
        await watch.discover()  # DNS names: their engines before the first request
        if self.keys is not None:
            await self.keys.sync()  # the stored keys before the first request
        # Before any server listens: no client pays the first counts and decision.
        await warm_up(
            self.policy, bpe, self._exact_executor, self.signals.board, watch.fleet.live_pool
        )
        exits = self._exits
        options = grpc_options(self.policy, self.worker)
        metrics_port = None
        if self._metrics_port is not None:
            metrics_port = start_metrics(
                exits,
                port=self._metrics_port,
                host=self._metrics_host,
                registry=self.metrics.registry,
            )
        admin = self.control.admin
        if self.worker is not None:
            await start_private(
                exits, worker=self.worker, options=options, recorder=self.path.recorder, admin=admin
            )
        admin_at = None
        if self._admin_address is not None:  # loopback or a Unix socket, never the pod IP
            admin_at = await start_admin(
                exits,
                address=self._admin_address,
                admin=admin,
                keys=self.keys,
                policy=self.policy,
                spend=self.stores.spend,
                wall_clock=self._wall_clock,
            )
        health_port = None
        if self._health_port is not None:  # stops after ext_proc: answers while it drains
            health_port = await start_health(
                exits,
                address=f"{self._health_host}:{self._health_port}",
                options=options,
                health=self._health,
            )
        grpc_address = f"{self._host}:{self._grpc_port}"
        if self._grpc_socket is not None:
            grpc_address = f"unix:{self._grpc_socket}"
        port = await start_ext_proc(
            exits,
            address=grpc_address,
            options=options,
            path=self.path,
            observers=self.observers,
            metrics=self.metrics,
            siblings=self.siblings,
            health=self._health,
            message_timeout_ms=self.policy().message_timeout_ms,
            grace_s=lambda: self._grace_s,
            tls=self._tls,
        )
        await start_loops(
            exits,
            watch_interval_s=self._watch_interval_s,
            policy=self.policy,
            path=self.path,
            control=self.control,
            keys=self.keys,
            engine_watch=watch,
            stores=self.stores,
            metrics=self.metrics,
            region=self.region,
        )
        if any(p.ingress for p in self.policy().regions.peers(self._region)):
            probe = PeerProbe(self.policy, self.path.links, self.path.crossing, this=self._region)
            task = asyncio.create_task(probe.run(), name="peer-probe")
            exits.push_async_callback(_cancelled, task)
        return SidecarAddress(
            self._host, port, metrics_port, admin_at, health_port, self._grpc_socket
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Undo what was built and started, last first: the loops, the ext_proc server
        (NOT_SERVING, its streams in flight finish within `grace_s`), the admin API, the
        private socket, /metrics, the siblings' channels, the fleet's count, the key store,
        the budget store, the observers, the tokenizer's threads. Safe unstarted."""
        self._grace_s = grace_s
        await self._exits.aclose()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
