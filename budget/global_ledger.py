"""The global ledger: where regions send their reports and get their leases.

What lives here: the `GlobalLedger` protocol, `InProcessGlobalLedger` (budget.leases'
`apply_report` on a book in memory: tests, the simulator, `slogate up` without a global
Redis) and `RedisGlobalLedger` (the same rule as budget/lua/lease_report.lua: one EVALSHA
per report, atomic on the server, the Redis server's TIME as the clock unless one is
injected for tests). Reports, leases and the stored records are MessagePack (msgspec here,
the cmsgpack Redis ships with its Lua): floats cross as IEEE doubles, so the script
computes on the very numbers apply_report does (cjson writes 14 significant digits), and
it packs and unpacks about twice as fast as cjson, which is most of the script's time.

Keys: `slogate:global:regions` (region -> its seq, pools and expiry) and
`slogate:global:tenant:<tenant>` (region -> its record of the tenant), each expiring
`KEY_TTL_S` after its last report. The global Redis is one server (or a primary with
replicas), not a cluster: one script reads every tenant of the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from budget.leases import (
    DEMAND_DECAY,
    IDLE_DEMAND,
    Lease,
    LeaseSettings,
    LedgerBook,
    PoolRoom,
    Report,
    TenantLease,
    apply_report,
)
from budget.redis_scripts import Scripts, script

# A tenant's records outlive the longest spend window (a month) that a ceiling holds.
KEY_TTL_S = 40 * 86400
PREFIX = "slogate:global"


class GlobalLedger(Protocol):
    async def report(self, report: Report) -> Lease: ...

    async def close(self) -> None: ...


class InProcessGlobalLedger:
    def __init__(self, settings: LeaseSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self.book = LedgerBook()

    async def report(self, report: Report) -> Lease:
        return apply_report(self.book, report, self._clock(), self._settings)

    async def close(self) -> None:
        return None


class RedisGlobalLedger:
    """`client`: a redis.asyncio.Redis (budget.redis_store.connect); `timeout_s` bounds one
    report's round trip (slower raises BudgetStoreError: the region counts it as failed)."""

    SCRIPT = "lease_report.lua"

    def __init__(
        self,
        client: Any,
        settings: LeaseSettings,
        timeout_s: float,
        clock: Callable[[], float] | None = None,
        prefix: str = PREFIX,
    ) -> None:
        sources = {self.SCRIPT: script("time.lua") + script(self.SCRIPT)}
        self._scripts = Scripts(client, sources, timeout_s)
        self._settings = settings
        self._clock = clock
        self._prefix = prefix

    async def report(self, report: Report) -> Lease:
        keys = [f"{self._prefix}:regions"]
        keys += [f"{self._prefix}:tenant:{line.tenant}" for line in report.tenants]
        settings = self._settings
        args = [
            repr(self._clock()) if self._clock is not None else "-1",
            repr(float(settings.lease_s)),
            repr(float(settings.fallback_for_s)),
            repr(float(settings.min_share)),
            "-1" if settings.fallback_share is None else repr(float(settings.fallback_share)),
            repr(DEMAND_DECAY),
            str(KEY_TTL_S),
            encode_report(report),
            repr(float(settings.report_interval_s)),
            repr(IDLE_DEMAND),
        ]
        reply = await self._scripts.run(self.SCRIPT, keys, args)
        return decode_lease(reply)

    async def close(self) -> None:
        await self._scripts.client.aclose()


def encode_report(report: Report) -> bytes:
    return msgspec.msgpack.encode(
        {
            "region": report.region,
            "seq": report.seq,
            "tenants": [
                {
                    "tenant": line.tenant,
                    "demand": float(line.demand),
                    "usage": float(line.usage),
                    "spend": _floats(line.spend),
                    "applied": float(line.applied),
                    "spend_limit": _floats(line.spend_limit),
                    "spend_applied": _floats(line.spend_applied),
                }
                for line in report.tenants
            ],
            "pools": {name: [room.level, room.waiting_full] for name, room in report.pools.items()},
        }
    )


def encode_lease(lease: Lease) -> bytes:
    """The Lease as the script answers it (decode_lease reads either)."""
    return msgspec.msgpack.encode(
        {
            "region": lease.region,
            "seq": lease.seq,
            "lease_s": float(lease.lease_s),
            "tenants": {
                tenant: {
                    "share": float(line.share),
                    "global_usage": float(line.global_usage),
                    "global_spend": _floats(line.global_spend),
                    "spend_ceiling": _floats(line.spend_ceiling),
                }
                for tenant, line in lease.tenants.items()
            },
            "peers": {
                region: {name: [room.level, room.waiting_full] for name, room in pools.items()}
                for region, pools in lease.peers.items()
            },
            "rebalanced": lease.rebalanced,
        }
    )


def decode_lease(raw: bytes) -> Lease:
    data = msgspec.msgpack.decode(raw)
    return Lease(
        region=data["region"],
        seq=int(data["seq"]),
        lease_s=float(data["lease_s"]),
        tenants={
            tenant: TenantLease(
                share=float(line["share"]),
                global_usage=float(line["global_usage"]),
                global_spend=_floats(line["global_spend"]),
                spend_ceiling=_floats(line["spend_ceiling"]),
            )
            for tenant, line in _object(data["tenants"]).items()
        },
        peers={
            region: {
                name: PoolRoom(int(room[0]), bool(room[1])) for name, room in _object(pools).items()
            }
            for region, pools in _object(data["peers"]).items()
        },
        rebalanced=int(data["rebalanced"]),
    )


def _object(value: Any) -> Mapping[str, Any]:
    # cmsgpack packs an empty table as an empty list, whether it was a list or a map.
    return value if isinstance(value, dict) else {}


def _floats(values: Any) -> dict[str, float]:
    return {key: float(value) for key, value in _object(values).items()}
