"""The admin API (protos/extproc/adminpb/admin.proto): servicer and the CLI's client side.

What lives here: `AdminService`, which answers from a running `Sidecar` (breaker board,
policy holder, budget store, in-flight table), and the table printers the `slogate status`
/ `keys` / `drill` / `reload` commands use. The server binds to loopback or a Unix socket
by default: it changes a live gateway (drills, reloads) and has no authentication.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format

from breaker.kv_admission import pool_capacity
from breaker.levels import BreakerLevel
from budget.failover import FailoverStore
from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from policy import Limits

if TYPE_CHECKING:
    from extproc.sidecar import Sidecar


def _limits(limits: Limits) -> pb.Limits:
    message = pb.Limits()
    for field in (
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_hour",
        "concurrent_requests",
        "max_context_tokens",
    ):
        value = getattr(limits, field)
        if value is not None:
            setattr(message, field, value)
    return message


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, sidecar: Sidecar) -> None:
        self._sidecar = sidecar
        self._last_transition: dict[str, str] = {}

    def note_transition(self, pool: str, text: str) -> None:
        self._last_transition[pool] = text

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusReply:
        sidecar = self._sidecar
        board = sidecar.board
        policy = sidecar.policy()
        now_s = time.monotonic()
        reply = pb.StatusReply(
            budget_store=policy.budget.store.value,
            redis_up=not isinstance(sidecar.store, FailoverStore) or sidecar.store.healthy,
            policy_source=policy.source,
            keys=len(policy.keys),
            inflight_requests=len(sidecar.decider.inflight),
            gpu_available=sidecar.gpu.available,
        )
        reply.quota_multipliers.update(sidecar.quotas.values)
        forecaster = sidecar.quotas.forecaster
        if forecaster.level is not None:
            reply.load_score = forecaster.level
            forecast = forecaster.forecast(sidecar.quotas.horizon)
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
        ledger = sidecar.kv_gate.ledger
        for name, pool in policy.pools.items():
            capacity = pool_capacity(pool, policy.budget.replicas)
            if capacity is None:
                continue
            held = reply.admission.add(
                pool=name,
                kv_tokens_held=ledger.in_flight.get(name, 0),
                requests_held=ledger.requests.get(name, 0),
            )
            if capacity.kv_tokens is not None:
                held.kv_tokens_capacity = capacity.kv_tokens
            if capacity.sequences is not None:
                held.requests_capacity = capacity.sequences
        return reply

    async def Keys(
        self, request: pb.KeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.KeysReply:
        sidecar = self._sidecar
        reply = pb.KeysReply()
        keys = sorted(sidecar.policy().keys.values(), key=lambda k: (k.tenant, k.key_id))
        for key in keys:
            if request.tenant and key.tenant != request.tenant:
                continue
            usage = await sidecar.store.usage(key.key_id)
            status = reply.keys.add(
                key_id=key.key_id,
                tenant=key.tenant,
                tier=key.tier.value,
                limits=_limits(key.limits),
                outstanding=await sidecar.store.outstanding(key.key_id),
                usage_1m=usage[60],
                usage_5m=usage[300],
                usage_1h=usage[3600],
            )
            dynamic = sidecar.key_quotas.tokens_per_minute(key)
            if dynamic is not None:
                status.dynamic_tokens_per_minute = dynamic
            safety = sidecar.key_quotas.safety_factor(key)
            if safety is not None:
                status.safety_factor = safety
            demand = sidecar.key_quotas.demand(key)
            if demand is not None:
                status.demand_tokens_per_minute = demand[0]
                if demand[1] is not None:
                    status.demand_forecast_tokens_per_minute = demand[1]
        return reply

    async def Drill(
        self, request: pb.DrillRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrillReply:
        board = self._sidecar.board
        if request.pool not in board.names():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no pool {request.pool!r}")
        if not 0 <= request.level <= 3 or request.minutes < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "level 0-3, minutes >= 0")
        duration_s = request.minutes * 60.0
        board.drill(request.pool, BreakerLevel(request.level), duration_s)
        self._sidecar.breaker_loop.export()
        return pb.DrillReply(pool=request.pool, level=request.level, remaining_s=duration_s)

    async def ReloadPolicy(
        self, request: pb.ReloadPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReloadPolicyReply:
        holder = self._sidecar.policy
        error = holder.reload_error()
        if error is not None:
            return pb.ReloadPolicyReply(ok=False, error=error, keys=len(holder().keys))
        return pb.ReloadPolicyReply(ok=True, keys=len(holder().keys))


# --- the CLI side ----------------------------------------------------------------------


def stub(address: str) -> tuple[grpc.aio.Channel, pb_grpc.AdminStub]:
    channel = grpc.aio.insecure_channel(address)
    return channel, pb_grpc.AdminStub(channel)


def as_json(message: Any) -> str:
    return json_format.MessageToJson(message, always_print_fields_with_no_presence=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _number(message: Any, field: str, fmt: str = "{:.3g}") -> str:
    return fmt.format(getattr(message, field)) if message.HasField(field) else "-"


def status_table(reply: pb.StatusReply) -> str:
    rows = [
        (
            b.pool,
            f"L{b.level}",
            f"L{b.signal_level}",
            "yes" if b.probing else "",
            f"L{b.drill_level} {b.drill_remaining_s:.0f}s" if b.drill_level else "",
            _number(b.signals, "p99_over_slo"),
            _number(b.signals, "error_rate"),
            _number(b.signals, "kv_cache_usage"),
            _number(b.signals, "gpu_memory_usage"),
            _number(b.signals, "queue_ratio"),
            b.last_transition,
        )
        for b in reply.breakers
    ]
    head = (
        f"policy {reply.policy_source} ({reply.keys} keys), budget store {reply.budget_store}"
        f" ({'up' if reply.redis_up else 'DEGRADED: local shares'}), "
        f"{reply.inflight_requests} requests in flight, "
        f"GPU {'available' if reply.gpu_available else 'unavailable'}\n"
        "quota multipliers: "
        + ", ".join(f"{t} {v:.2f}" for t, v in sorted(reply.quota_multipliers.items()))
        + f" (load {_number(reply, 'load_score')}, forecast {_number(reply, 'load_forecast')})"
    )
    text = (
        head
        + "\n\n"
        + table(
            (
                "pool",
                "level",
                "signals",
                "probing",
                "drill",
                "p99/slo",
                "5xx",
                "kv",
                "gpu",
                "queue",
                "last",
            ),
            rows,
        )
    )
    if reply.admission:
        held = [
            (
                a.pool,
                f"{a.kv_tokens_held} / {_number(a, 'kv_tokens_capacity', '{:.0f}')}",
                f"{a.requests_held} / {_number(a, 'requests_capacity', '{:.0f}')}",
            )
            for a in reply.admission
        ]
        text += "\n\nadmission (this sidecar)\n" + table(
            ("pool", "KV tokens held / may hold", "requests held / may hold"), held
        )
    return text


def keys_table(reply: pb.KeysReply) -> str:
    rows = [
        (
            k.key_id,
            k.tenant,
            k.tier,
            _number(k.limits, "requests_per_minute", "{}"),
            _number(k.limits, "tokens_per_minute", "{}"),
            _number(k.limits, "concurrent_requests", "{}"),
            k.outstanding,
            f"{k.usage_1m:.0f}",
            f"{k.usage_5m:.0f}",
            f"{k.usage_1h:.0f}",
            _number(k, "dynamic_tokens_per_minute", "{:.0f}"),
            _number(k, "safety_factor", "{:.2f}"),
            _number(k, "demand_tokens_per_minute", "{:.0f}"),
            _number(k, "demand_forecast_tokens_per_minute", "{:.0f}"),
        )
        for k in reply.keys
    ]
    return table(
        (
            "key",
            "tenant",
            "tier",
            "rpm",
            "tpm",
            "conc",
            "in flight",
            "1m",
            "5m",
            "1h",
            "dynamic tpm",
            "safety",
            "demand tpm",
            "forecast",
        ),
        rows,
    )
