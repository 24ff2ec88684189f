"""The sidecar process: its composition root (`slogate serve` runs it: extproc.runtime.serve).

What lives here: `Sidecar`, which builds the parts and connects them — the policy holder,
the breaker board and its signals, the admission chain (admission.assembly, the same the
simulator builds), the request path, the servicers and their servers, the periodic loops —
and starts and stops them. It holds no business rule: every formula lives in the module
that owns the concept. How its servers are built and bound lives in
extproc.runtime.grpc_servers (PortTaken, re-exported here), its periodic loops in
extproc.runtime.periodic.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from admission.assembly import build_admission, expiry_s
from admission.chain import OutcomeSink
from breaker.board import BreakerBoard
from breaker.controller import TierMultipliers
from breaker.key_quotas import KeyQuotas
from breaker.latency import ResponseWindows
from budget.prefixed_store import PrefixedStore
from extproc.request.candidate import CANDIDATE_BUDGETS, CandidateJudge
from extproc.request.engine_outcomes import EngineOutcomes
from extproc.request.flow import Decider
from extproc.request.identity import ApiKeyResolver
from extproc.request.inflight import InFlight
from extproc.request.tokens import PromptCorrections, PromptCounter, exact_counter
from extproc.runtime.candidate_holder import CandidateHolder
from extproc.runtime.engine_watch import watch_engines
from extproc.runtime.events import MetricsEvents
from extproc.runtime.gpu import GpuMemory
from extproc.runtime.grpc_servers import (
    PortTaken,
    grpc_options,
    start_admin,
    start_ext_proc,
    start_metrics,
    start_private,
)
from extproc.runtime.key_store import build_key_store
from extproc.runtime.loop_lag import LoopLagCollector
from extproc.runtime.loops import BreakerLoop, QuotaLoop
from extproc.runtime.periodic import every, start_loops
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.spend_metrics import SpendMetrics
from extproc.runtime.stores import build_stores
from extproc.runtime.warm_up import warm_up
from extproc.runtime.workers import Siblings, WorkerSlot
from extproc.service.access_log import OutcomeRecorder
from extproc.service.admin import AdminService
from extproc.service.candidate_metrics import CandidateMetrics
from extproc.service.decision_log import DecisionLog
from extproc.service.engine_metrics import EngineCollector
from extproc.service.genai_metrics import GenAiMetrics
from extproc.service.known_series import held_by_pool, policy_series, start_series, waiting_by_pool
from extproc.service.metrics import SidecarMetrics
from extproc.service.prompt_feedback import PromptFeedback
from extproc.service.tracing import start_tracing
from extproc.service.traffic_record import TrafficRecorder, dropped_counter
from policy import BudgetStoreKind, Policy, Tier

# Imported from here by the CLI (a taken port is reported, not a traceback).
__all__ = ["PortTaken", "Sidecar", "SidecarAddress"]


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
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        worker: WorkerSlot | None = None,
    ) -> None:
        """`worker`: this process is one of `slogate serve --workers N`
        (extproc.runtime.workers)."""
        self.worker = worker
        self.siblings = Siblings(worker) if worker is not None else None
        # Injected for tests that run this object graph on a virtual clock beside the
        # simulator's (tests/test_sim_matches_sidecar.py); a process uses the real ones.
        self.clock = clock or time.monotonic
        self.metrics = SidecarMetrics()
        self.policy = PolicyHolder(policy_path, self.metrics)
        initial = self.policy()  # what is read only at start (policy.START_ONLY_SETTINGS)
        self.metrics.rerank_tenants(initial)  # the cap holds from the first request
        breaker = initial.breaker
        ttl_s = expiry_s(initial)
        # Slots fine enough that the breaker's window forgets a spike within ~1/6 of it.
        self.windows = ResponseWindows(
            clock=self.clock,
            slot_s=min(10.0, breaker.window_s / 6),
            horizon_s=max(300.0, breaker.window_s),
        )
        self.gpu = GpuMemory()
        self.metrics.gpu_available.set(1 if self.gpu.available else 0)
        # The engines of every pool: their state, and which one gets each request.
        self.engine_watch = watch_engines(self.policy, self.clock)
        self.fleet = self.engine_watch.fleet
        self.picker = self.engine_watch.picker
        self.scraper = self.engine_watch.scraper
        self.metrics.registry.register(EngineCollector(self.picker, self.policy))
        self.metrics.registry.register(LoopLagCollector(self.engine_watch.loop_lag, self.clock))
        self.board = BreakerBoard(
            self.policy,
            self.windows,
            # Over the serving engines only: a dead one is the engine's problem.
            kv_cache_usage=self.fleet.kv_usage if self.scraper else _no_reading,
            gpu_memory_usage=self.gpu.usage,
            clock=self.clock,
            engine_queue=self.scraper.queue_ratio if self.scraper else _no_reading,
            engine_ttft=self.scraper.ttft_quantile_s if self.scraper else _no_quantile,
            engines_out=self.fleet.out,
            engines_up=self.fleet.up_fraction,
        )
        self.quotas = TierMultipliers()
        self.key_quotas = KeyQuotas(breaker.controller_interval_s)
        self.stores = build_stores(self.policy, self.metrics, self.clock, clock)
        self._wall_clock = clock or time.time  # UTC: the spend budgets' day and month
        self.store = self.stores.budgets
        # Keys managed without editing the policy (key_store:), looked up before its keys.
        self.keys = build_key_store(self.policy, self.metrics.registry)
        self.admission = build_admission(
            board=self.board,
            store=self.store,
            events=MetricsEvents(self.metrics, self.key_quotas),
            clock=self.clock,
            ttl_s=ttl_s,
            multipliers=self.quotas.values,
            ceilings=self.key_quotas,
            rng=rng or random.Random(),
            policy=self.policy,
            new_waiter=_new_future,
            book=self.stores.kv,
            # Envoy's max_message_timeout is written from the policy it started with.
            wait_cap_s=initial.longest_wait_s,
            live=self.fleet.live_pool,
            spend=None
            if self.stores.spend is None
            else (self.stores.spend, SpendMetrics(self.metrics.registry)),
            wall_clock=self._wall_clock,
        )
        # Every known pool's, tier's and store's series exist from the start, at 0.
        self.metrics.admission.source = held_by_pool(
            self.admission.kv.book.held_by_pool, self.policy
        )
        self.metrics.admission.waiting = waiting_by_pool(self.admission.kv.room.counts, self.policy)
        start_series(self.metrics, initial, initial.budget.store is BudgetStoreKind.REDIS)
        self.policy.on_reload.append(self._known_series)
        self.metrics.wait_alert_bound(Tier.CRITICAL.value).set(
            initial.waiting_room.alert_critical_p99_wait_s
        )
        # Counting settings take effect at start: the worker threads and the cache live on.
        self._exact_executor = ThreadPoolExecutor(initial.counting.workers, "slogate-tokenizer")
        self._exact_tokenizer = exact_tokenizer
        self.counter = PromptCounter(None, initial.counting, self._exact_executor)
        self.corrections = PromptCorrections()
        # A candidate policy judged beside the enforced one, never enforced (policy.candidate).
        candidate_metrics = CandidateMetrics(self.metrics.registry, self.metrics.tenants)
        self.candidate = CandidateHolder(self.policy, candidate_metrics)
        self.judge = CandidateJudge(
            self.candidate,
            candidate_metrics,
            ttl_s,
            self.keys,
            clock,
            # A fleet sharing Redis judges the candidate's budgets on the fleet's traffic.
            store=PrefixedStore(self.store, CANDIDATE_BUDGETS)
            if initial.budget.store is BudgetStoreKind.REDIS
            else None,
        )
        self.decider = Decider(
            policy=self.policy,
            identity=ApiKeyResolver(self.policy, self.keys),
            counter=self.counter,
            corrections=self.corrections,
            admission=self.admission.chain,
            inflight=InFlight(self.clock, ttl_s, worker.prefix if worker else None),
            picker=self.picker,
            candidate=self.judge,
        )
        self.tracer = start_tracing(initial.telemetry.tracing)  # None: off, not imported
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
            self.admission.chain,
            PromptFeedback(self.corrections, self.metrics),
            EngineOutcomes(self.picker),
            GenAiMetrics(self.metrics.registry, self.policy),  # OpenTelemetry's names
            self.judge,
        ]
        if self.decision_log is not None:
            sinks.append(self.decision_log)
        self.traffic = (
            TrafficRecorder.from_config(
                initial.traffic_record,
                dropped_counter(self.metrics.registry),
                Path(initial.source).parent,
            )
            if initial.traffic_record is not None
            else None
        )
        if self.traffic is not None:
            sinks.append(self.traffic)
        self.recorder = OutcomeRecorder(
            self.metrics,
            self.windows,
            self.decider.inflight,
            self.policy,
            sinks,
            engines_out=self.fleet.out,
        )
        self.breaker_loop = BreakerLoop(self.board, self.metrics)
        self.quota_loop = QuotaLoop(
            self.policy,
            self.board,
            self.quotas,
            self.key_quotas,
            self.admission.kv,
            self.fleet.fresh_kv_usage if self.scraper else None,
            self.metrics,
        )
        self.admin = AdminService(
            policy=self.policy,
            board=self.board,
            store=self.store,
            inflight=self.decider.inflight,
            gpu=self.gpu,
            quotas=self.quotas,
            key_quotas=self.key_quotas,
            book=self.admission.kv.book,
            room=self.admission.kv.room,
            clock=self.clock,
            on_drill=self.breaker_loop.export,
            siblings=self.siblings,
            engines=self.scraper,
            fleet=self.fleet,
        )
        self.breaker_loop.on_transition = self.admin.note_transition
        self._host = host
        self._grpc_port = grpc_port
        self._metrics_port = metrics_port
        # Prometheus may need the pod address while ext_proc stays on loopback.
        self._metrics_host = metrics_host or host
        self._admin_address = admin_address
        self._watch_interval_s = watch_interval_s
        self._server: grpc.aio.Server | None = None
        self._admin_server: grpc.aio.Server | None = None
        self._private_server: grpc.aio.Server | None = None
        self._metrics_server: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._health = health.aio.HealthServicer()

    async def _known_series(self, policy: Policy) -> None:
        policy_series(self.metrics, policy)  # a reload's new pools get their series

    def _grpc_options(self) -> list[tuple[str, int]]:
        return grpc_options(self.policy, self.worker)

    async def start(self) -> SidecarAddress:
        bpe = None
        if self._exact_tokenizer:
            # Loaded before the servers start (~1 s), off the loop: no request is ever
            # counted by its byte bound only because the tokenizer was still loading.
            bpe = await asyncio.get_running_loop().run_in_executor(
                self._exact_executor, exact_counter, self.policy().counting.engine
            )
            self.counter.use(bpe)
        await self.engine_watch.discover()  # DNS names: their engines before the first request
        if self.keys is not None:
            await self.keys.sync()  # the stored keys before the first request
        # Before any server listens: no client pays the first counts and decision.
        await warm_up(self.policy, bpe, self._exact_executor, self.board, self.fleet.live_pool)
        server, port = await start_ext_proc(
            f"{self._host}:{self._grpc_port}",
            self._grpc_options(),
            self.decider,
            self.metrics,
            self.decision_log,
            self.policy().message_timeout_ms,
            self.traffic,
            self.recorder,
            self.siblings,
            self._health,
            self.tracer,
        )
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        metrics_port = None
        if self._metrics_port is not None:
            httpd = start_metrics(self._metrics_port, self._metrics_host, self.metrics.registry)
            self._metrics_server = httpd
            metrics_port = int(httpd.server_port)
        admin = await self._start_admin()
        if self.worker is not None:
            await self._start_private(self.worker)
        self._tasks = start_loops(
            self._watch_interval_s,
            self.policy,
            self.admission,
            self.candidate,
            self.recorder,
            self.breaker_loop,
            self.quota_loop,
            self.keys,
            self.engine_watch,
            self.metrics,
        )
        members = self.stores.members
        if members is not None:
            self.metrics.fleet_replicas.set(await members.beat())
            self._tasks.append(
                asyncio.create_task(every(lambda: members.interval_s, self._heartbeat))
            )
        return SidecarAddress(self._host, port, metrics_port, admin)

    async def _start_private(self, worker: WorkerSlot) -> None:
        """A worker's own Unix socket (grpc_servers.start_private)."""
        self._private_server = await start_private(
            worker, self._grpc_options(), self.recorder, self.admin
        )

    async def _start_admin(self) -> str | None:
        """The admin API on its own server: loopback or a Unix socket, never the pod IP."""
        if self._admin_address is None:
            return None
        self._admin_server, address = await start_admin(
            self._admin_address,
            self.admin,
            self.keys,
            self.policy,
            self.stores.spend,
            self._wall_clock,
        )
        return address

    async def _heartbeat(self) -> None:
        if self.stores.members is not None:
            self.metrics.fleet_replicas.set(await self.stores.members.beat())

    async def stop(self, grace_s: float = 5.0) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            # In-flight streams finish within the grace period; new ones are refused.
            await self._server.stop(grace_s)
        if self._admin_server is not None:
            await self._admin_server.stop(1.0)
        if self._private_server is not None:
            await self._private_server.stop(1.0)
        if self.siblings is not None:
            await self.siblings.close()
        if self.stores.members is not None:
            await self.stores.members.leave()  # the others' local shares grow at once
        if self.keys is not None:
            await self.keys.close()
        await self.store.close()
        if self.decision_log is not None:
            self.decision_log.close()
        if self.tracer is not None:
            self.tracer.close()
        if self.traffic is not None:
            self.traffic.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self._exact_executor.shutdown(wait=False, cancel_futures=True)


def _new_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def _no_reading(pool: str) -> float | None:
    return None  # engine metrics are not scraped: no signal


def _no_quantile(pool: str, q: float, window_s: float, min_samples: int) -> float | None:
    return None
