"""The sidecar's named parts, each made by one small builder from the parts before it.

What lives here: `Signals` (what the breakers read and decide: the response windows, the GPU,
the engines' watch, the breaker board, the tiers' and keys' quotas), `Observers` (what
records the decisions and outcomes beside Prometheus: the tracer, the decision log, the
traffic record), `RequestPath` (the tokenizer's threads, the prompt counter, the admission
chain, the candidate policy's judge, the Decider and the outcome recorder) and `Control`
(the breaker and quota loops, the forecast's refits and the admin API's servicer), with
`build_signals`, `build_observers`, `build_request_path` and `build_control`. The stores
are built in extproc.runtime.stores, the servers in extproc.runtime.grpc_servers, the loops
in extproc.runtime.periodic; extproc.runtime.sidecar puts them together and runs them.

What must not happen here: a business rule. A builder connects what the owning modules
made; a formula or a choice of the policy's lives with the concept it belongs to.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from admission.assembly import AssembledChain, build_admission, expiry_s
from admission.chain import OutcomeSink
from admission.crossing import Crossing, NoPeers, RoundTrips
from admission.regions import PeerRooms
from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from budget.ahead import AheadCeilings, AheadSeat
from budget.key_quotas import KeyQuotas
from budget.prefixed_store import PrefixedStore
from budget.quotas import TierMultipliers
from extproc.request.candidate import CANDIDATE_BUDGETS, CandidateJudge
from extproc.request.crossing_token import MIN_SECRET_BYTES, CrossingDesk
from extproc.request.engine_outcomes import EngineOutcomes
from extproc.request.flow import Decider
from extproc.request.identity import ApiKeyResolver
from extproc.request.inflight import InFlight
from extproc.request.tokens.corrections import PromptCorrections
from extproc.request.tokens.prompt import PromptCounter
from extproc.runtime.candidate_holder import CandidateHolder
from extproc.runtime.engine_watch import EngineWatch, watch_engines
from extproc.runtime.events import MetricsEvents
from extproc.runtime.forecast_refit import ForecastHolder, ForecastRefitter
from extproc.runtime.gpu import GpuMemory
from extproc.runtime.key_store import KeyStore
from extproc.runtime.loop_lag import LoopLagCollector
from extproc.runtime.loops import BreakerLoop, QuotaLoop
from extproc.runtime.policy_holder import PolicyHolder
from extproc.runtime.region_agent import RegionAgent
from extproc.runtime.spend_metrics import SpendMetrics
from extproc.runtime.stores import Stores
from extproc.runtime.workers import Siblings, WorkerSlot
from extproc.service.access_log import OutcomeRecorder
from extproc.service.admin import AdminService
from extproc.service.candidate_metrics import CandidateMetrics
from extproc.service.crossing_metrics import CrossingMetrics
from extproc.service.decision_log import DECISION_FILES, DecisionLog
from extproc.service.engine_metrics import EngineCollector
from extproc.service.forecast_metrics import ForecastMetrics
from extproc.service.genai_metrics import GenAiMetrics
from extproc.service.known_series import held_by_pool, policy_series, start_series, waiting_by_pool
from extproc.service.metrics import SidecarMetrics
from extproc.service.observers import RequestObserver
from extproc.service.prompt_feedback import PromptFeedback
from extproc.service.record_files import dropped_counter
from extproc.service.tracing import DecisionTracer, start_tracing
from extproc.service.traffic_record import TRAFFIC_FILES, TrafficRecorder
from policy.schema import BudgetStoreKind, Policy


@dataclass(frozen=True, slots=True)
class Signals:
    """What the breakers read and what they and the quota controller decide."""

    windows: ResponseWindows
    gpu: GpuMemory
    engine_watch: EngineWatch  # the engines of every pool: their state, the picker, scrapes
    board: BreakerBoard
    quotas: TierMultipliers
    key_quotas: KeyQuotas
    # Each tenant's seasonal demand forecast (forecast.outlook.Outlook), refitted from the
    # traffic record by Control.forecast; answers None until the first refit.
    outlook: ForecastHolder
    # What admission applies: the reactive multipliers through the planner of quotas ahead
    # of ramps (budget.ahead), whose seat takes the seasonal forecast's outlook when a
    # refit fills `outlook` (None until then: the policy's calendar alone), and the
    # multiples of its `learn: true` events that the same refit learns (Control.forecast).
    applied: dict[str, float]
    ahead: AheadSeat


def build_signals(
    policy: PolicyHolder, metrics: SidecarMetrics, clock: Callable[[], float]
) -> Signals:
    initial = policy()
    windows = ResponseWindows.covering(initial.breaker.window_s, clock)
    gpu = GpuMemory()
    metrics.gpu_available.set(1 if gpu.available else 0)
    watch = watch_engines(policy, clock)
    fleet, scraper = watch.fleet, watch.scraper
    metrics.registry.register(EngineCollector(watch.picker, policy))
    metrics.registry.register(LoopLagCollector(watch.loop_lag, clock))
    board = BreakerBoard(
        policy,
        windows,
        # Over the serving engines only: a dead one is the engine's problem.
        kv_cache_usage=fleet.kv_usage if scraper else _no_reading,
        gpu_memory_usage=gpu.usage,
        clock=clock,
        engine_queue=scraper.queue_ratio if scraper else _no_reading,
        engine_ttft=scraper.ttft_quantile_s if scraper else _no_quantile,
        engines_out=fleet.out,
        engines_up=fleet.up_fraction,
    )
    key_quotas = KeyQuotas(initial.breaker.controller_interval_s)
    quotas = TierMultipliers()
    outlook = ForecastHolder()
    return Signals(
        windows,
        gpu,
        watch,
        board,
        quotas,
        key_quotas,
        outlook,
        dict(quotas.values),
        AheadSeat(forecast=outlook),
    )


@dataclass(frozen=True, slots=True)
class Observers:
    """What records decisions and outcomes beside Prometheus; None: not configured."""

    tracer: DecisionTracer | None
    decision_log: DecisionLog | None
    traffic: TrafficRecorder | None

    def watching(self) -> list[RequestObserver]:
        """The ones that watch each request's life, its decision and its answer alike."""
        observed = (self.tracer, self.decision_log, self.traffic)
        return [observer for observer in observed if observer is not None]

    def close(self) -> None:
        for observer in (self.decision_log, self.tracer, self.traffic):
            if observer is not None:
                observer.close()


def build_observers(policy: Policy, metrics: SidecarMetrics) -> Observers:
    """From the policy the sidecar started with: these settings take effect at start. The
    tracer first: it is the one that can fail (TracingUnavailable), before the others start
    a writer thread that nothing would stop."""
    # None: tracing off, OpenTelemetry not even imported.
    tracer = start_tracing(policy.telemetry.tracing)
    decision_log = None
    if policy.decision_log is not None:
        config = policy.decision_log
        dropped = dropped_counter(metrics.registry, DECISION_FILES)
        decision_log = DecisionLog.from_config(config, dropped)
    traffic = None
    if policy.traffic_record is not None:
        traffic = TrafficRecorder.from_config(
            policy.traffic_record,
            dropped_counter(metrics.registry, TRAFFIC_FILES),
            Path(policy.source).parent,
        )
    return Observers(tracer, decision_log, traffic)


@dataclass(frozen=True, slots=True)
class RequestPath:
    """What a request goes through, from its headers to its access-log entry."""

    executor: ThreadPoolExecutor  # the tokenizer's threads
    counter: PromptCounter
    corrections: PromptCorrections
    admission: AssembledChain
    candidate: CandidateHolder  # a candidate policy judged beside the enforced one
    judge: CandidateJudge
    decider: Decider
    recorder: OutcomeRecorder
    # Crossing regions: the peers' measured round trips (extproc.runtime.peer_probe fills
    # them) and the metrics of what crossed.
    links: RoundTrips
    crossing: CrossingMetrics


def build_request_path(
    *,
    policy: PolicyHolder,
    metrics: SidecarMetrics,
    signals: Signals,
    stores: Stores,
    keys: KeyStore | None,
    observers: Observers,
    executor: ThreadPoolExecutor,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    rng: random.Random,
    worker: WorkerSlot | None,
    injected_clock: Callable[[], float] | None,
    region: RegionAgent | None = None,
    peer_rooms: PeerRooms | None = None,
    region_name: str | None = None,
) -> RequestPath:
    """`executor`: the tokenizer's threads. `injected_clock`: the clock a test passed in
    (None: each part's own default), which the candidate's budgets keep as the budget
    stores do. `region`: this region's shares of the global tenants, and where their
    demand is counted (idle while the policy has no `regions:`); the peers' room crossing
    reads is its (`peer_rooms`: another view, a test's). `region_name`: `slogate serve
    --region` (None: the policy's `regions.this`)."""
    initial = policy()
    ttl_s = expiry_s(initial)
    watch = signals.engine_watch
    links = RoundTrips()
    crossing_metrics = CrossingMetrics(metrics.registry)
    secret = read_secret(initial.regions.crossing.secret_file)
    desk = (
        None if secret is None else CrossingDesk(secret, wall_clock, crossing_metrics, region_name)
    )
    # Without the secret no token can be minted: nothing crosses.
    rooms = peer_rooms or region or NoPeers()
    # The peers Envoy routes to: rendered from the policy this sidecar starts with.
    routable = [p.name for p in initial.regions.peers(region_name) if p.ingress is not None]
    crossing = (
        None if desk is None else Crossing(rooms, links, crossing_metrics, region_name, routable)
    )
    admission = build_admission(
        board=signals.board,
        store=stores.budgets,
        events=MetricsEvents(metrics, signals.key_quotas),
        clock=clock,
        ttl_s=ttl_s,
        multipliers=signals.applied,
        ceilings=AheadCeilings(signals.key_quotas, lambda: signals.ahead.planner),
        rng=rng,
        policy=policy,
        new_waiter=_new_future,
        book=stores.kv,
        # Envoy's max_message_timeout is written from the policy it started with.
        wait_cap_s=initial.longest_wait_s,
        live=watch.fleet.live_pool,
        largest_engine=watch.fleet.largest_kv_tokens,
        spend=None if stores.spend is None else (stores.spend, SpendMetrics(metrics.registry)),
        wall_clock=wall_clock,
        shares=region,
        demand=None if region is None else region.demand,
        crossing=crossing,
        settle_apart=stores.shared,
    )
    _known_series(metrics, policy, admission)
    counter = PromptCounter(None, initial.counting, executor)
    corrections = PromptCorrections()
    candidate_metrics = CandidateMetrics(metrics.registry, metrics.tenants)
    candidate = CandidateHolder(policy, candidate_metrics)
    judge = CandidateJudge(
        candidate,
        candidate_metrics,
        ttl_s,
        keys,
        injected_clock,
        # A fleet sharing Redis judges the candidate's budgets on the fleet's traffic.
        store=PrefixedStore(stores.budgets, CANDIDATE_BUDGETS)
        if initial.budget.store is BudgetStoreKind.REDIS
        else None,
    )
    decider = Decider(
        policy=policy,
        identity=ApiKeyResolver(keys),
        counter=counter,
        corrections=corrections,
        admission=admission.chain,
        inflight=InFlight(clock, ttl_s, worker.prefix if worker else None),
        picker=watch.picker,
        candidate=judge,
        crossing=desk,
    )
    sinks: list[OutcomeSink] = [
        admission.chain,
        PromptFeedback(corrections, metrics),
        EngineOutcomes(watch.picker),
        GenAiMetrics(metrics.registry, policy),  # OpenTelemetry's names
        judge,
        *observers.watching(),
    ]
    recorder = OutcomeRecorder(
        metrics,
        signals.windows,
        decider.inflight,
        policy,
        sinks,
        engines_out=watch.fleet.out,  # an engine out of its pool gives the pool no signals
    )
    return RequestPath(
        executor,
        counter,
        corrections,
        admission,
        candidate,
        judge,
        decider,
        recorder,
        links,
        crossing_metrics,
    )


def _known_series(metrics: SidecarMetrics, policy: PolicyHolder, admission: AssembledChain) -> None:
    """Every known pool's, tier's and store's series exist from the start, at 0, and a
    reload's new pools get theirs."""
    metrics.admission.source = held_by_pool(admission.kv.book.held_by_pool, policy)
    metrics.admission.waiting = waiting_by_pool(admission.kv.dispatcher.room.counts, policy)
    start_series(metrics, policy())

    async def reloaded(new: Policy) -> None:
        policy_series(metrics, new)

    policy.on_reload.append(reloaded)


@dataclass(frozen=True, slots=True)
class Control:
    """What runs beside the requests: the breakers' and the quota controller's loops, and
    the admin API's servicer (the operator's view and levers)."""

    breaker_loop: BreakerLoop
    quota_loop: QuotaLoop
    admin: AdminService
    # Refits Signals.outlook on the policy's schedule; sets Signals.ahead.learned.
    forecast: ForecastRefitter


def build_control(
    *,
    policy: PolicyHolder,
    metrics: SidecarMetrics,
    signals: Signals,
    stores: Stores,
    path: RequestPath,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    siblings: Siblings | None,
    decision_log: DecisionLog | None = None,
    region: RegionAgent | None = None,
) -> Control:
    watch = signals.engine_watch
    breaker_loop = BreakerLoop(signals.board, metrics)
    quota_loop = QuotaLoop(
        policy=policy,
        board=signals.board,
        quotas=signals.quotas,
        key_quotas=signals.key_quotas,
        kv=path.admission.kv,
        # The footprint ratio is learned from the engines' KV usage, when it is scraped.
        kv_cache_usage=watch.fleet.fresh_kv_usage if watch.scraper else None,
        metrics=metrics,
        applied=signals.applied,
        ahead=signals.ahead,
        on_ahead_move=None if decision_log is None else decision_log.quota_moved,
    )
    admin = AdminService(
        policy=policy,
        board=signals.board,
        store=stores.budgets,
        inflight=path.decider.inflight,
        gpu=signals.gpu,
        quotas=signals.quotas,
        key_quotas=signals.key_quotas,
        applied=signals.applied,
        ahead=signals.ahead,
        book=path.admission.kv.book,
        room=path.admission.kv.dispatcher.room,
        clock=clock,
        on_drill=breaker_loop.export,
        siblings=siblings,
        engines=watch.scraper,
        fleet=watch.fleet,
        region=None if region is None else region.view,
    )
    breaker_loop.on_transition = admin.note_transition
    forecast = ForecastRefitter(
        policy, signals.outlook, ForecastMetrics(metrics), wall_clock, ahead=signals.ahead
    )
    return Control(breaker_loop, quota_loop, admin, forecast)


def read_secret(path: str | None) -> bytes | None:
    """The regions' shared crossing secret, read once at start (a new one needs a
    restart, in every region at once); None: no file named."""
    if path is None:
        return None
    secret = Path(path).read_bytes().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{path}: the regions' crossing secret must be at least {MIN_SECRET_BYTES} bytes"
        )
    return secret


def _new_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def _no_reading(pool: str) -> float | None:
    return None  # engine metrics are not scraped: no signal


def _no_quantile(pool: str, q: float, window_s: float, min_samples: int) -> float | None:
    return None
