"""`slogate serve --workers N`: N sidecar processes behind one gRPC port.

What lives here: `WorkerSlot` (what one worker knows of the others), `Siblings` (the
worker's calls to the others: access-log entries of their requests, drills and reloads),
and `merge_expositions` (the workers' /metrics as one); the supervisor that starts them is
extproc.runtime.supervisor.

Why processes: the request path is Python, and one process uses one core. The workers
bind the same port with SO_REUSEPORT, so the kernel spreads Envoy's connections over them;
budgets, the KV ledger, heads of line and attained service are already shared through
Redis, which is why N > 1 needs the Redis store.

What does not split by connection is the access log: Envoy sends each request's entry on
its access-log stream, which lands on one worker, not necessarily the one that decided the
request. Every worker's tracking ids carry its slot (`<base><index>-<n>`), and a worker
forwards the entries of its siblings' requests to them over their private Unix sockets, so
each request is settled by the worker that holds its decision.

One /metrics: the supervisor serves the workers' expositions merged — counters, histograms
and amounts held summed; levels, ratios and signals the highest; health gauges the lowest.
One admin API: worker 0 serves it, and passes drills and reloads on to the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

log = logging.getLogger("slogate.workers")

# Gauges whose workers' values are not added up: each worker reads the same fleet.
_HIGHEST = frozenset(
    {
        "slogate_breaker_level",
        "slogate_breaker_drill_level",
        "slogate_breaker_signal",
        "slogate_quota_multiplier",
        "slogate_load_score",
        "slogate_safety_factor",
        "slogate_fleet_replicas",
        "slogate_kv_footprint_ratio",
        "slogate_kv_lent",
        "slogate_wait_alert_seconds",
        "slogate_tenant_demand_tokens_per_minute",
        "slogate_prompt_correction",
        "slogate_policy_keys",
        "slogate_key_store_keys",
        "slogate_key_store_sync_age_seconds",  # the stalest worker's
        "slogate_tenant_spend_used_ratio",  # each worker reads the one shared budget
    }
)
_LOWEST = frozenset(
    {
        "slogate_redis_up",
        "slogate_kv_ledger_shared",
        "slogate_gpu_available",
        "slogate_key_store_up",
        "process_start_time_seconds",  # the first worker's start
    }
)


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    index: int
    count: int
    base: str  # every worker's tracking ids start with base + its index
    socket_dir: Path

    @property
    def prefix(self) -> str:
        return f"{self.base}{self.index:x}"

    def socket(self, index: int) -> str:
        return f"unix:{self.socket_dir / f'worker-{index}.sock'}"

    def owner_of(self, tracking: str) -> int | None:
        """The worker that decided `tracking` (None: no worker of this serve)."""
        head = tracking.split("-", 1)[0]
        if not head.startswith(self.base):
            return None
        try:
            index = int(head[len(self.base) :], 16)
        except ValueError:
            return None
        return index if 0 <= index < self.count else None


class Siblings:
    """One worker's channels to the others, over their private Unix sockets."""

    def __init__(self, slot: WorkerSlot) -> None:
        self.slot = slot
        self._channels = {
            i: grpc.aio.insecure_channel(slot.socket(i))
            for i in range(slot.count)
            if i != slot.index
        }

    @property
    def own(self) -> int:
        return self.slot.index

    def owner_of(self, tracking: str) -> int | None:
        return self.slot.owner_of(tracking)

    async def forward(self, index: int, entries: list[accesslog_pb2.HTTPAccessLogEntry]) -> None:
        """Access-log entries of worker `index`'s requests, to it."""
        message = als_pb2.StreamAccessLogsMessage()
        message.identifier.log_name = "slogate-forwarded"
        message.http_logs.log_entry.extend(entries)

        async def one() -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
            yield message

        stub = als_pb2_grpc.AccessLogServiceStub(self._channels[index])
        try:
            await stub.StreamAccessLogs(one(), timeout=5.0)
        except grpc.aio.AioRpcError as error:  # its requests expire there instead
            log.warning("forwarding %d entries to worker %d failed: %s", len(entries), index, error)

    async def drill(self, request: pb.DrillRequest) -> None:
        await self._each("drill", lambda admin: admin.Drill(request, timeout=5.0))

    async def reload(self) -> None:
        await self._each(
            "reload", lambda admin: admin.ReloadPolicy(pb.ReloadPolicyRequest(), timeout=5.0)
        )

    async def drain(self, request: pb.DrainRequest) -> None:
        await self._each("drain", lambda admin: admin.Drain(request, timeout=5.0))

    async def _each(self, what: str, call: Callable[[pb_grpc.AdminStub], Awaitable[Any]]) -> None:
        """`call` on every worker's admin API in turn: one that fails is logged, and the
        others still get it."""
        for index, channel in self._channels.items():
            try:
                await call(pb_grpc.AdminStub(channel))
            except grpc.aio.AioRpcError as error:
                log.warning("%s on worker %d failed: %s", what, index, error)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


def _known(pick: Callable[[float, float], float], a: float, b: float) -> float:
    """The higher or lower of two workers' values, NaN ("no data yet": a breaker signal, the
    safety factor before the first step) yielding to a number: max(nan, x) is either,
    depending on the order the workers answered."""
    if math.isnan(a):
        return b
    return a if math.isnan(b) else pick(a, b)


def merge_expositions(texts: Iterable[str]) -> str:
    """The workers' /metrics as one exposition (text format)."""
    kinds: dict[str, tuple[str, str]] = {}  # family -> (type, help)
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            kinds.setdefault(family.name, (family.type, family.documentation))
            merged = values.setdefault(family.name, {})
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # each worker's start: no one value for the whole
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in merged:
                    merged[key] = sample.value
                elif family.name in _HIGHEST:
                    merged[key] = _known(max, merged[key], sample.value)
                elif family.name in _LOWEST:
                    merged[key] = _known(min, merged[key], sample.value)
                else:
                    merged[key] = merged[key] + sample.value
    lines = []
    for name, (kind, documentation) in kinds.items():
        # As prometheus_client writes it: a counter's family is named by its samples.
        typed = f"{name}_total" if kind == "counter" else name
        lines.append(f"# HELP {typed} {_escape(documentation)}")
        lines.append(f"# TYPE {typed} {kind}")
        for (sample_name, labels), value in values[name].items():
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(
                f"{sample_name}{{{rendered}}} {value!r}" if labels else f"{sample_name} {value!r}"
            )
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
