"""The region's own store of what its replicas saw and of the lease they share.

What lives here: `RegionStore` (the protocol the region agent, extproc.runtime.region_agent,
talks to), `RedisRegionStore` (the region's Redis: the budgets' own, so every replica of
the region shares it) and `InProcessRegionStore` (the in-process budget store: the
process is the whole region). Each keeps:

- the demand the replicas flushed since the lease holder last took it, per tenant (taken
  and reset at once);
- each flushed batch's id for a while (`BATCH_MEMORY_S`): a batch sent again after a
  timeout (it may have landed) is added once;
- the usage they flushed, per tenant, cumulative (never reset: what the region reports is
  a total, so a report repeated or lost changes nothing at the global ledger);
- the lock naming the region's lease holder, for a time (`SET NX PX`, extended by its
  holder each interval; a holder that dies lets it lapse and another replica takes it);
- the latest lease the holder received (`LeaseRecord`: MessagePack, the global ledger's
  own encoding of a Lease), which every replica reads each interval.

Keys, in the region's Redis: `slogate:region:{<region>}:demand|usage|holder|lease` (the
region's name as the hash tag: one slot in a cluster, so the take is one transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from redis import exceptions as redis_errors

from budget.global_ledger import decode_lease, encode_lease
from budget.leases import Lease
from budget.region_demand import Flushed
from budget.store import BudgetStoreError

# How long a flushed batch's id is remembered: a replica sends a failed batch again at its
# next flush (an interval later) and goes on until it lands, so this outlasts any outage
# the region's Redis comes back from with its keys.
BATCH_MEMORY_S = 3600

# Add a batch of demand and usage once: its id is set with NX first; a batch already seen
# (sent again after a timeout that had landed) changes nothing. KEYS: demand, usage, the
# batch's id; ARGV: the memory in s, then tenant, demand, usage per tenant.
_FLUSH = """
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 2, #ARGV, 3 do
  if tonumber(ARGV[i + 1]) ~= 0 then redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
  if tonumber(ARGV[i + 2]) ~= 0 then redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 2]) end
end
return 1
"""

# Take the lock, or extend it when this replica holds it already: one round trip.
_HOLD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The holder's latest Lease, whether its report was answered (False: the holder is cut
    off; the readers say so too) and the region's usage it reported (for status)."""

    lease: Lease
    answered: bool
    usage: Mapping[str, float]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(
            {
                "lease": encode_lease(self.lease),
                "answered": self.answered,
                "usage": dict(self.usage),
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord:
        data = msgspec.msgpack.decode(raw)
        usage = {tenant: float(v) for tenant, v in data["usage"].items()}
        return cls(decode_lease(data["lease"]), bool(data["answered"]), usage)


@dataclass(frozen=True, slots=True)
class RegionTotals:
    demand: Mapping[str, float] = field(default_factory=dict)  # since the last take
    usage: Mapping[str, float] = field(default_factory=dict)  # cumulative


class RegionStore(Protocol):
    async def flush(self, region: str, parts: Mapping[str, Flushed], batch: str) -> None:
        """This replica's demand and usage since its last flush, added to the region's
        once per `batch` id (the same batch sent again adds nothing)."""
        ...

    async def take(self, region: str) -> RegionTotals:
        """The region's demand since the last take (reset) and its cumulative usage."""
        ...

    async def hold(self, region: str, holder: str, ttl_s: float) -> bool:
        """Take or extend the region's lock for `holder`; False: another replica holds it."""
        ...

    async def put_lease(self, region: str, record: LeaseRecord) -> None: ...

    async def lease(self, region: str) -> LeaseRecord | None: ...


def _key(region: str, what: str) -> str:
    return f"slogate:region:{{{region}}}:{what}"


def _floats(raw: Mapping[Any, Any]) -> dict[str, float]:
    return {(k.decode() if isinstance(k, bytes) else str(k)): float(v) for k, v in raw.items()}


class RedisRegionStore:
    def __init__(self, client: Any, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._hold = client.register_script(_HOLD)
        self._flush = client.register_script(_FLUSH)

    async def _run(self, what: str, call: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except (redis_errors.RedisError, OSError, TimeoutError) as error:
            raise BudgetStoreError(
                f"redis region {what}: {type(error).__name__}: {error}"
            ) from error

    async def flush(self, region: str, parts: Mapping[str, Flushed], batch: str) -> None:
        if not parts:
            return
        keys = [_key(region, "demand"), _key(region, "usage"), _key(region, f"batch:{batch}")]
        args: list[str | int] = [BATCH_MEMORY_S]
        for tenant, part in parts.items():
            args += [tenant, repr(float(part.demand)), repr(float(part.usage))]
        await self._run("flush", self._flush(keys=keys, args=args))

    async def take(self, region: str) -> RegionTotals:
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(_key(region, "demand"))
        pipe.delete(_key(region, "demand"))
        pipe.hgetall(_key(region, "usage"))
        demand, _, usage = await self._run("take", pipe.execute())
        return RegionTotals(_floats(demand), _floats(usage))

    async def hold(self, region: str, holder: str, ttl_s: float) -> bool:
        held = await self._run(
            "hold", self._hold(keys=[_key(region, "holder")], args=[holder, int(ttl_s * 1000)])
        )
        return bool(held)

    async def put_lease(self, region: str, record: LeaseRecord) -> None:
        await self._run("put lease", self._client.set(_key(region, "lease"), record.encode()))

    async def lease(self, region: str) -> LeaseRecord | None:
        raw = await self._run("lease", self._client.get(_key(region, "lease")))
        return None if raw is None else LeaseRecord.decode(raw)


class InProcessRegionStore:
    """The in-process budget store's region: this process is all of it, and its holder."""

    def __init__(self) -> None:
        self._demand: dict[str, dict[str, float]] = {}
        self._usage: dict[str, dict[str, float]] = {}
        self._leases: dict[str, LeaseRecord] = {}

    async def flush(self, region: str, parts: Mapping[str, Flushed], batch: str) -> None:
        # In process a flush cannot half-land: nothing to remember.
        demand = self._demand.setdefault(region, {})
        usage = self._usage.setdefault(region, {})
        for tenant, part in parts.items():
            demand[tenant] = demand.get(tenant, 0.0) + part.demand
            usage[tenant] = usage.get(tenant, 0.0) + part.usage

    async def take(self, region: str) -> RegionTotals:
        demand = self._demand.pop(region, {})
        return RegionTotals(demand, dict(self._usage.get(region, {})))

    async def hold(self, region: str, holder: str, ttl_s: float) -> bool:
        return True

    async def put_lease(self, region: str, record: LeaseRecord) -> None:
        self._leases[region] = record

    async def lease(self, region: str) -> LeaseRecord | None:
        return self._leases.get(region)
