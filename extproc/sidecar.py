"""Process wiring of the sidecar: policy holder, gRPC server, metrics endpoint, reloads.

What lives here: `PolicyHolder` (the one atomically swapped, frozen policy; reload on file
change or SIGHUP, a bad new policy is refused and the old one stays) and `Sidecar`, which
builds the decider, the services and the servers, and stops them gracefully.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from breaker.board import BreakerBoard
from breaker.controller import TierMultipliers
from breaker.engine import EngineScraper, GpuMemory
from breaker.latency import ResponseWindows
from breaker.shedding import budget_multiplier
from budget.failover import FailoverStore
from budget.redis_store import RedisStore, connect
from budget.store import BudgetStore, InProcessStore
from extproc.accesslog import AccessLogService, OutcomeRecorder, OutcomeSink
from extproc.admin import AdminService
from extproc.adminpb import admin_pb2_grpc
from extproc.breaking import BreakerGate, BreakerLoop
from extproc.budgeting import BudgetGate
from extproc.decision_log import DecisionLog
from extproc.identity import ApiKeyResolver
from extproc.kv_gate import KvGate
from extproc.metrics import SidecarMetrics
from extproc.prompt_feedback import PromptFeedback
from extproc.quotas import KeyQuotas
from extproc.request_flow import AdmissionChain, Decider
from extproc.server import ExternalProcessorService
from extproc.tokens import DeepSeekBpe, PromptCorrections, PromptCounter
from policy import BudgetStoreKind, Policy, PolicyError, load_policy

log = logging.getLogger("slogate.sidecar")

# grpcio limits its messages to 4 MiB by default; a buffered body is one message.
_GRPC_MESSAGE_SLACK_BYTES = 1 << 20


class PolicyHolder:
    """The active policy. Readers call it per request; a reload swaps one reference."""

    def __init__(self, path: Path, metrics: SidecarMetrics) -> None:
        self.path = path
        self._metrics = metrics
        self._policy = load_policy(path)
        self._mtime_ns = self._stat()
        metrics.policy_keys.set(len(self._policy.keys))

    def __call__(self) -> Policy:
        return self._policy

    def _stat(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return 0

    def reload(self) -> bool:
        return self.reload_error() is None

    def reload_error(self) -> str | None:
        """Re-read the file; None when the new policy is active, else why it was refused."""
        try:
            policy = load_policy(self.path)
        except (PolicyError, OSError) as error:
            self._metrics.policy_reloads("rejected").inc()
            log.error("policy reload refused, keeping the active policy: %s", error)
            return str(error)
        self._policy = policy
        self._metrics.policy_reloads("ok").inc()
        self._metrics.policy_keys.set(len(policy.keys))
        log.info("policy reloaded from %s (%d keys)", self.path, len(policy.keys))
        return None

    def reload_if_changed(self) -> bool:
        mtime = self._stat()
        if mtime == self._mtime_ns:
            return False
        self._mtime_ns = mtime
        return self.reload()


def build_store(policy: Policy, metrics: SidecarMetrics) -> BudgetStore:
    """The budget store the policy asks for. Changing it needs a restart, not a reload."""
    config = policy.budget
    if config.store is BudgetStoreKind.MEMORY:
        return InProcessStore()

    def on_decision(degraded: bool) -> None:
        metrics.budget_store_decisions("local" if degraded else "shared").inc()
        metrics.redis_up.set(0 if degraded else 1)

    metrics.redis_up.set(1)
    # The URL may carry a password: deployments pass it through the environment (a Secret).
    url = os.environ.get("SLOGATE_REDIS_URL") or config.redis_url
    shared = RedisStore(
        connect(url, config.redis_cluster),
        timeout_s=config.redis_timeout_ms / 1000.0,
    )
    return FailoverStore(shared, InProcessStore(), config.replicas, on_decision=on_decision)


@dataclass(frozen=True, slots=True)
class SidecarAddress:
    host: str
    grpc_port: int
    metrics_port: int | None
    admin: str | None  # host:port or unix:path of the admin API


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
    ) -> None:
        self.metrics = SidecarMetrics()
        self._admin_address = admin_address
        self._admin_server: grpc.aio.Server | None = None
        self.policy = PolicyHolder(policy_path, self.metrics)
        initial = self.policy()
        window_s = initial.breaker.window_s
        # Slots fine enough that the breaker's window forgets a spike within ~1/6 of it.
        self.windows = ResponseWindows(
            clock=time.monotonic,
            slot_s=min(10.0, window_s / 6),
            horizon_s=max(300.0, window_s),
        )
        self.gpu = GpuMemory()
        self.metrics.gpu_available.set(1 if self.gpu.available else 0)
        self.scraper = EngineScraper(
            lambda: {name: pool.endpoints for name, pool in self.policy().pools.items()},
            interval_s=initial.breaker.scrape_interval_s,
            stale_after_s=initial.breaker.stale_after_s,
        )
        scraping = initial.breaker.scrape_metrics
        self.board = BreakerBoard(
            self.policy,
            self.windows,
            kv_cache_usage=self.scraper.kv_cache_usage if scraping else (lambda pool: None),
            gpu_memory_usage=self.gpu.usage,
            clock=time.monotonic,
            engine_queue=self.scraper.queue_ratio if scraping else (lambda pool: None),
        )
        self.admin = AdminService(self)
        self.quotas = TierMultipliers()
        self.key_quotas = KeyQuotas(initial.breaker.controller_interval_s)
        for tier, value in self.quotas.values.items():
            self.metrics.quota_multiplier(tier).set(value)
        self.breaker_loop = BreakerLoop(
            self.board,
            self.metrics,
            on_transition=lambda t: self.admin.note_transition(
                t.pool, f"L{int(t.from_level)}->L{int(t.to_level)} {t.reason}"
            ),
        )
        # Counting settings take effect at start: the worker threads and the cache live on.
        self._exact_executor = ThreadPoolExecutor(initial.counting.workers, "slogate-tokenizer")
        self._exact_tokenizer = exact_tokenizer
        self.counter = PromptCounter(None, initial.counting, self._exact_executor)
        self.corrections = PromptCorrections()
        self.store = build_store(initial, self.metrics)
        # A reservation outlives the longest request by a minute before it expires.
        self.budgets = BudgetGate(
            self.store,
            self.metrics,
            initial.upstream_timeout_s + 60.0,
            scale=lambda d: (
                budget_multiplier(self.board.level(d.pool), d.caller.tier)
                * self.quotas.values[d.caller.tier.value]
            ),
            ceiling=lambda d: (
                self.key_quotas.tokens_per_minute(d.caller)
                if self.policy().breaker.controller_key_budgets
                else None
            ),
            on_settled=lambda d, charge: self.key_quotas.observe(
                d.caller.key_id, charge.weighted_tokens
            ),
        )
        self.kv_gate = KvGate(self.policy, self.metrics)
        self.decider = Decider(
            policy=self.policy,
            identity=ApiKeyResolver(self.policy),
            counter=self.counter,
            corrections=self.corrections,
            admission=AdmissionChain(
                [BreakerGate(self.board, self.policy, self.metrics), self.kv_gate, self.budgets]
            ),
        )
        self.decision_log = (
            DecisionLog(
                Path(initial.decision_log.directory),
                initial.decision_log.sample_rate,
                initial.decision_log.keep_days,
            )
            if initial.decision_log is not None
            else None
        )
        sinks: list[OutcomeSink] = [
            self.budgets,
            self.kv_gate,
            PromptFeedback(self.corrections, self.metrics),
        ]
        if self.decision_log is not None:
            sinks.append(self.decision_log)
        self.recorder = OutcomeRecorder(
            self.metrics, self.windows, self.decider.inflight, sinks=sinks, policy=self.policy
        )
        self._host = host
        self._grpc_port = grpc_port
        self._metrics_port = metrics_port
        # Prometheus may need the pod address while ext_proc stays on loopback.
        self._metrics_host = metrics_host or host
        self._watch_interval_s = watch_interval_s
        self._server: grpc.aio.Server | None = None
        self._metrics_server: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._health = health.aio.HealthServicer()

    def _grpc_options(self) -> list[tuple[str, int]]:
        limit = self.policy().max_body_bytes + _GRPC_MESSAGE_SLACK_BYTES
        return [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # Envoy pings its HTTP/2 upstreams; grpcio would answer with GOAWAY otherwise.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.http2.max_ping_strikes", 0),
            # Two sidecars on one port must fail loudly, not silently share traffic.
            ("grpc.so_reuseport", 0),
        ]

    async def start(self) -> SidecarAddress:
        if self._exact_tokenizer:
            # Loaded before the servers start (~1 s), off the loop: no request is
            # ever counted by its byte bound only because the tokenizer was still loading.
            bpe = await asyncio.get_running_loop().run_in_executor(
                self._exact_executor, DeepSeekBpe
            )
            self.counter.use(bpe)
        server = grpc.aio.server(options=self._grpc_options())
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessorService(self.decider, self.metrics, self.decision_log), server
        )
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(AccessLogService(self.recorder), server)
        # grpc.health.v1 for Kubernetes probes: SERVING once started, NOT_SERVING on stop.
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        port = server.add_insecure_port(f"{self._host}:{self._grpc_port}")
        if port == 0:
            raise OSError(f"cannot bind the sidecar gRPC port {self._host}:{self._grpc_port}")
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        metrics_port = None
        if self._metrics_port is not None:
            httpd, _thread = start_http_server(
                self._metrics_port, addr=self._metrics_host, registry=self.metrics.registry
            )
            self._metrics_server = httpd
            metrics_port = int(httpd.server_port)
        admin = await self._start_admin()
        self._tasks = [
            asyncio.create_task(self._housekeeping()),
            asyncio.create_task(self._run_breaker()),
            asyncio.create_task(self._run_controller()),
        ]
        if self.policy().breaker.scrape_metrics:
            self._tasks.append(asyncio.create_task(self.scraper.run()))
        return SidecarAddress(self._host, port, metrics_port, admin)

    async def _start_admin(self) -> str | None:
        """The admin API on its own server: loopback or a Unix socket, never the pod IP."""
        if self._admin_address is None:
            return None
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServicer_to_server(self.admin, server)
        bound = server.add_insecure_port(self._admin_address)
        if bound == 0 and not self._admin_address.startswith("unix:"):
            raise OSError(f"cannot bind the admin API on {self._admin_address}")
        await server.start()
        self._admin_server = server
        if self._admin_address.startswith("unix:"):
            return self._admin_address
        return f"{self._admin_address.rsplit(':', 1)[0]}:{bound}"

    async def _run_controller(self) -> None:
        """Every controller interval: fleet load score -> tier multipliers on budgets."""
        while True:
            config = self.policy().breaker
            await asyncio.sleep(config.controller_interval_s)
            if not config.controller_enabled:
                continue
            try:
                self.control_quotas()
            except Exception:
                log.exception("quota controller step failed")

    def control_quotas(self) -> None:
        score, memory_usage = self.board.fleet_load()  # the most loaded pool sets the pace
        if self.policy().breaker.scrape_metrics:
            self.kv_gate.observe(self.scraper.kv_cache_usage)
        for adjustment in self.quotas.step(score):
            tier = adjustment.what.split(":", 1)[1]
            direction = "shrink" if adjustment.after < adjustment.before else "grow"
            log.info(
                "quota multiplier %s %.2f -> %.2f (score %.2f, forecast %.2f)",
                tier,
                adjustment.before,
                adjustment.after,
                adjustment.inputs["score"],
                adjustment.inputs["forecast"],
            )
            self.metrics.quota_adjustments(tier, direction).inc()
            self.metrics.quota_multiplier(tier).set(adjustment.after)
        keys = list(self.policy().keys.values())
        self.key_quotas.step(keys, memory_usage)
        for key in keys:
            demand = self.key_quotas.demand(key)
            if demand is None:
                continue
            actual, forecast = demand
            self.metrics.tenant_demand(key.tenant_label, "actual").set(actual)
            if forecast is not None:
                self.metrics.tenant_demand(key.tenant_label, "forecast").set(forecast)
        lowest = self.key_quotas.lowest_safety_factor()
        if lowest is not None:
            self.metrics.safety_factor.set(lowest)
        if score is not None:
            self.metrics.load_score("measured").set(score)
            forecast = self.quotas.forecaster.forecast(self.quotas.horizon)
            if forecast is not None:
                self.metrics.load_score("forecast").set(forecast)

    async def _run_breaker(self) -> None:
        while True:
            await asyncio.sleep(self.policy().breaker.evaluate_interval_s)
            try:
                self.breaker_loop.tick()
            except Exception:  # the loop must outlive one bad evaluation
                log.exception("breaker evaluation failed")

    async def _housekeeping(self) -> None:
        """Policy file changes, and the expiry of requests whose access log never came."""
        while True:
            await asyncio.sleep(self._watch_interval_s)
            self.policy.reload_if_changed()
            await self.recorder.expire()

    async def stop(self, grace_s: float = 5.0) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            # In-flight streams finish within the grace period; new ones are refused.
            await self._server.stop(grace_s)
        if self._admin_server is not None:
            await self._admin_server.stop(1.0)
        await self.store.close()
        if self.decision_log is not None:
            self.decision_log.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self._exact_executor.shutdown(wait=False, cancel_futures=True)


async def run_sidecar(
    policy_path: Path,
    host: str,
    grpc_port: int,
    metrics_port: int | None,
    exact: bool = True,
    metrics_host: str | None = None,
    admin_address: str | None = "127.0.0.1:50052",
) -> None:
    """`slogate serve`: run until SIGINT/SIGTERM; SIGHUP reloads the policy."""
    sidecar = Sidecar(
        policy_path,
        host,
        grpc_port,
        metrics_port,
        exact_tokenizer=exact,
        metrics_host=metrics_host,
        admin_address=admin_address,
    )
    address = await sidecar.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, sidecar.policy.reload)
    metrics = (
        f" metrics http://{metrics_host or host}:{address.metrics_port}/metrics"
        if address.metrics_port
        else ""
    )
    admin = f" admin {address.admin}" if address.admin else ""
    print(
        f"slogate sidecar ready: grpc {host}:{address.grpc_port}{metrics}{admin} pid {os.getpid()}",
        flush=True,
    )
    await stop.wait()
    await sidecar.stop()
