"""The admin API's servicer (protos/extproc/adminpb/admin.proto).

What lives here: `AdminService`, which answers from the parts it is given — the policy
holder, the breaker board, the budget store, the in-flight table, the quotas, the KV
ledger — never from the whole sidecar. The server binds to loopback or a Unix socket by
default: it changes a live gateway (drills, reloads); who may call it is
extproc.service.admin_auth's rule (a bearer token, or a Unix socket's permissions). Keys are
changed by extproc.service.key_admin on the same server. The CLI's side (client, tables) is
extproc.service.admin_client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sized
from typing import Protocol

import grpc

from admission.kv.book import FailoverBook, KvBook
from admission.waiting_room import WaitingRoom
from breaker.board import BreakerBoard
from breaker.engine import EngineReadings
from breaker.levels import BreakerLevel, Transition
from budget.ahead import AheadSeat
from budget.failover import FailoverStore
from budget.key_quotas import KeyQuotas
from budget.quotas import TierMultipliers
from budget.store import BudgetStore
from engines.engine import Engine, EngineState
from engines.state import EngineFleet
from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.service.region_metrics import RegionView
from policy.domain import LIMIT_FIELDS, Limits, Tier
from policy.schema import Policy


class ReloadablePolicy(Protocol):
    # A reload's notice beside success (a candidate policy refused; None: none).
    notice: str | None

    def __call__(self) -> Policy: ...
    async def reload_error(self) -> str | None: ...


class GpuView(Protocol):
    available: bool


def _limits(limits: Limits) -> pb.Limits:
    message = pb.Limits()
    for field in LIMIT_FIELDS:
        value = getattr(limits, field)
        if value is not None:
            setattr(message, field, value)
    return message


class FanOut(Protocol):
    async def drill(self, request: pb.DrillRequest) -> None: ...
    async def reload(self) -> None: ...
    async def drain(self, request: pb.DrainRequest) -> None: ...


class AdminService(pb_grpc.AdminServicer):
    def __init__(
        self,
        *,
        policy: ReloadablePolicy,
        board: BreakerBoard,
        store: BudgetStore,
        inflight: Sized,
        gpu: GpuView,
        quotas: TierMultipliers,
        key_quotas: KeyQuotas,
        book: KvBook,
        applied: Mapping[str, float] | None = None,
        ahead: AheadSeat | None = None,
        room: WaitingRoom,
        clock: Callable[[], float],
        on_drill: Callable[[], None],
        siblings: FanOut | None = None,
        engines: EngineReadings | None = None,
        fleet: EngineFleet | None = None,
        region: Callable[[], RegionView | None] | None = None,
    ) -> None:
        """`siblings`: the other workers of `slogate serve --workers N`, told of every drill,
        drain and reload made here (None: this process alone). `engines`: the scraped
        engine metrics (None: scraping is off); `fleet`: the pools' engines and their
        state. `applied`: the multipliers admission applies (the reactive ones through the
        planner of quotas ahead of ramps; None: the reactive ones); `ahead`: that planner's
        seat (budget.ahead). `region`: this region's lease of the global budgets, as the
        region agent holds it now (None, or answering None: one region)."""
        self._siblings = siblings
        self._arguments = dict(
            policy=policy,
            board=board,
            store=store,
            inflight=inflight,
            gpu=gpu,
            quotas=quotas,
            key_quotas=key_quotas,
            applied=applied,
            ahead=ahead,
            book=book,
            room=room,
            clock=clock,
            on_drill=on_drill,
            engines=engines,
            fleet=fleet,
            region=region,
        )
        self._policy = policy
        self._region = region
        self._engines = engines
        self._fleet = fleet
        self._board = board
        self._store = store
        self._inflight = inflight
        self._gpu = gpu
        self._quotas = quotas
        self._key_quotas = key_quotas
        self._applied = applied
        self._ahead = ahead
        self._book = book
        self._room = room
        self._clock = clock
        self._on_drill = on_drill  # export the drilled level at once
        self._last_transition: dict[str, str] = {}

    def note_transition(self, transition: Transition) -> None:
        self._last_transition[transition.pool] = (
            f"L{int(transition.from_level)}->L{int(transition.to_level)} {transition.reason}"
        )

    def alone(self) -> AdminService:
        """The same service without the siblings: what a worker answers the others with
        (a drill passed on is not passed on again)."""
        return AdminService(**self._arguments)  # type: ignore[arg-type]

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusReply:
        board = self._board
        policy = self._policy()
        now_s = time.monotonic()
        reply = pb.StatusReply(
            budget_store=policy.budget.store.value,
            redis_up=not isinstance(self._store, FailoverStore) or self._store.healthy,
            policy_source=policy.source,
            keys=len(policy.keys),
            inflight_requests=len(self._inflight),
            gpu_available=self._gpu.available,
            kv_ledger=_ledger_label(self._book),
        )
        reply.quota_multipliers.update(
            self._applied if self._applied is not None else self._quotas.values
        )
        self._add_ahead(reply)
        forecaster = self._quotas.forecaster
        if forecaster.level is not None:
            reply.load_score = forecaster.level
            forecast = forecaster.forecast(self._quotas.horizon)
            if forecast is not None:
                reply.load_forecast = forecast
        for name in board.names():
            state = board.states.get(name)
            breaker = reply.breakers.add(pool=name, level=int(board.level(name)))
            if state is None:
                continue
            breaker.signal_level = int(state.level)
            breaker.probing = state.probing
            if now_s < state.drill_until_s and state.drill_level > BreakerLevel.L0:
                breaker.drill_level = int(state.drill_level)
                breaker.drill_remaining_s = state.drill_until_s - now_s
            breaker.last_transition = self._last_transition.get(name, "")
            reading = board.readings.get(name)
            if reading is not None:
                for field in (
                    "p99_over_slo",
                    "error_rate",
                    "kv_cache_usage",
                    "gpu_memory_usage",
                    "queue_ratio",
                ):
                    value = getattr(reading.signals, field)
                    if value is not None:
                        setattr(breaker.signals, field, value)
        for name, pool in policy.pools.items():
            # What admission admits against: the serving engines' part of the pool.
            live = self._fleet.live_pool(pool) if self._fleet is not None else pool
            capacity = self._book.capacity(live)
            if capacity is None:
                continue
            view = self._book.view(name)  # the fleet's, when the ledger is shared
            held = reply.admission.add(
                pool=name, kv_tokens_held=view.tokens, requests_held=view.sequences
            )
            if capacity.kv_tokens is not None:
                held.kv_tokens_capacity = capacity.kv_tokens
            if capacity.sequences is not None:
                held.requests_capacity = capacity.sequences
            for tier in Tier:
                held.waiting[tier.value] = self._room.waiting(name, tier)
            held.oldest_wait_s = self._room.oldest_wait_s(name, self._clock())
        self._add_engines(reply, policy)
        self._add_region(reply)
        return reply

    def _add_region(self, reply: pb.StatusReply) -> None:
        view = None if self._region is None else self._region()
        if view is None:
            return
        region = reply.region
        region.region = view.region
        region.ledger_state = view.state
        region.holder = view.holder
        region.seq = view.seq
        if view.lease_expires_in_s is not None:
            region.lease_expires_in_s = view.lease_expires_in_s
        for tenant in view.tenants:
            row = region.tenants.add(tenant=tenant.tenant, usage=tenant.usage)
            if tenant.share is not None:
                row.share = tenant.share
            if tenant.global_usage is not None:
                row.global_usage = tenant.global_usage

    def _add_ahead(self, reply: pb.StatusReply) -> None:
        """What the quotas ahead of ramps hold now, each raise with its reason."""
        planner = None if self._ahead is None else self._ahead.planner
        if planner is None:
            return
        for tenant, held in sorted(planner.raises.items()):
            reply.ahead_raises.add(
                tenant=tenant,
                reason=held.reason,
                multiple=held.multiple,
                since_s=held.since_s,
                ramp_came=held.came,
            )
        reply.ahead_kv_share_caps.update(planner.kv_share_caps())
        if planner.lending:
            reply.ahead_lent = planner.config.lend
        reply.ahead_expired.update(planner.expired)

    def _add_engines(self, reply: pb.StatusReply, policy: Policy) -> None:
        if self._fleet is None:
            return
        for name in policy.pools:
            for engine in self._fleet.engines(name):
                self._engine_row(reply.engines.add(), engine, policy)

    def _engine_row(self, row: pb.EngineReading, engine: Engine, policy: Policy) -> None:
        assert self._fleet is not None
        spec = policy.pools.get(engine.pool)
        row.pool = engine.pool
        row.endpoint = engine.address
        row.engine = spec.engine.value if spec is not None else ""
        row.state = self._fleet.state(engine).value
        row.dead_reason = engine.dead_reason if row.state == EngineState.DEAD else ""
        row.held_tokens = engine.held_tokens
        row.held_requests = engine.held_sequences
        row.picked = engine.picked
        row.answered = engine.answered
        row.failed = engine.failed
        if spec is not None and (capacity := self._fleet.kv_tokens(engine, spec)) is not None:
            row.kv_capacity_tokens = capacity
        readings = self._engines
        seen = None if readings is None else readings.latest(engine.pool, engine.host, engine.port)
        row.age_s = -1.0
        if seen is None:
            return
        row.age_s, snapshot = seen
        row.first_tokens = snapshot.ttft_buckets[-1][1] if snapshot.ttft_buckets else 0
        for field in ("kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate"):
            value = getattr(snapshot, field)
            if value is not None:
                setattr(row, field, value)

    async def Keys(
        self, request: pb.KeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeysReply:
        reply = pb.KeysReply()
        keys = sorted(self._policy().keys.values(), key=lambda k: (k.tenant, k.key_id))
        for key in keys:
            if request.tenant and key.tenant != request.tenant:
                continue
            usage = await self._store.usage(key.budget_id)  # its tenant's when shared
            status = reply.keys.add(
                key_id=key.key_id,
                tenant=key.tenant,
                tier=key.tier.value,
                limits=_limits(key.limits),
                outstanding=await self._store.outstanding(key.budget_id),
                usage_1m=usage[60],
                usage_5m=usage[300],
                usage_1h=usage[3600],
            )
            dynamic = self._key_quotas.tokens_per_minute(key)
            if dynamic is not None:
                status.dynamic_tokens_per_minute = dynamic
            safety = self._key_quotas.safety_factor(key)
            if safety is not None:
                status.safety_factor = safety
            demand = self._key_quotas.demand(key)
            if demand is not None:
                status.demand_tokens_per_minute = demand[0]
                if demand[1] is not None:
                    status.demand_forecast_tokens_per_minute = demand[1]
        return reply

    async def Drill(
        self, request: pb.DrillRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrillReply:
        board = self._board
        if request.pool not in board.names():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no pool {request.pool!r}")
        if not 0 <= request.level <= 3 or request.minutes < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "level 0-3, minutes >= 0")
        duration_s = request.minutes * 60.0
        board.drill(request.pool, BreakerLevel(request.level), duration_s)
        self._on_drill()
        if self._siblings is not None:
            await self._siblings.drill(request)
        return pb.DrillReply(pool=request.pool, level=request.level, remaining_s=duration_s)

    async def ReloadPolicy(
        self, request: pb.ReloadPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReloadPolicyReply:
        holder = self._policy
        error = await holder.reload_error()
        if error is None and self._siblings is not None:
            await self._siblings.reload()
        if error is not None:
            return pb.ReloadPolicyReply(ok=False, error=error, keys=len(holder().keys))
        return pb.ReloadPolicyReply(ok=True, keys=len(holder().keys), error=holder.notice or "")

    async def Drain(
        self, request: pb.DrainRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrainReply:
        if self._fleet is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "engines are not tracked")
        assert self._fleet is not None
        engines = self._fleet.drain(request.engine, not request.undo, request.pool or None)
        if not engines:
            where = f" in pool {request.pool!r}" if request.pool else ""
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no engine {request.engine!r}{where}")
        if self._siblings is not None:
            await self._siblings.drain(request)
        reply = pb.DrainReply()
        policy = self._policy()
        for engine in engines:
            self._engine_row(reply.engines.add(), engine, policy)
        return reply


def _ledger_label(book: KvBook) -> str:
    if isinstance(book, FailoverBook):
        return "fleet" if book.healthy else "local share"
    return "this sidecar"
