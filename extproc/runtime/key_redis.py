"""The key store's Redis side: the records, the change counter and the acknowledgements.

What lives here: `RedisKeys`. The keys are one hash (digest -> JSON record, times as Unix
seconds) beside a change counter every write bumps and a hash of what each replica applied,
all under the `{keys}` hash tag, so a Redis Cluster keeps them in one slot. Writes go through
one Lua script that keeps the stricter of the stored and the written revocation and expiry:
records only ever get shorter-lived, so a write made from a replica's stale copy (its last
poll, up to `poll_interval_s` old) or racing another admin can never undo a revocation.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from budget.redis_scripts import Scripts
from budget.store import BudgetStoreError
from extproc.service.key_admin import KeyStoreError
from policy._reader import PolicyError
from policy.keyring import KeyRecord, parse_key_record

log = logging.getLogger("slogate.keys")

RECORDS = "slogate:{keys}:records"  # digest -> JSON record
VERSION = "slogate:{keys}:version"  # bumped by every change
APPLIED = "slogate:{keys}:applied"  # replica -> "<version> <unix time>"

# KEYS: records, version; ARGV: digest, JSON, digest, JSON, ... -> the new version.
_PUT = """
for i = 1, #ARGV, 2 do
  local new = cjson.decode(ARGV[i + 1])
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local old = cjson.decode(raw)
    for _, field in ipairs({'revoked_at', 'expires_at'}) do
      if type(old[field]) == 'number' and
         (type(new[field]) ~= 'number' or old[field] < new[field]) then
        new[field] = old[field]
      end
    end
  end
  redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(new))
end
return redis.call('INCR', KEYS[2])
"""


class RedisKeys:
    def __init__(self, client: Any, replica: str, timeout_s: float = 2.0) -> None:
        self._client = client
        self._scripts = Scripts(client, {"put": _PUT}, timeout_s)
        self.replica = replica

    async def version(self) -> int:
        return int(await self._client.get(VERSION) or 0)

    async def records(self) -> dict[str, KeyRecord]:
        return parse_records(await self.raw_records())

    async def raw_records(self) -> dict[Any, Any]:
        """The hash as Redis sent it: parsed by `parse_records`, off the loop when large."""
        raw: dict[Any, Any] = await self._client.hgetall(RECORDS)
        return raw

    async def put(self, *records: KeyRecord) -> int:
        """Write records (the stricter revocation and expiry kept) and bump the change
        counter, in one script; the new version."""
        args: list[str] = []
        for record in records:
            args += [record.key_sha256, json.dumps(record.to_json(unix_times=True))]
        try:
            return int(await self._scripts.run("put", [RECORDS, VERSION], args))
        except BudgetStoreError as error:
            raise KeyStoreError(f"the key store's Redis: {error}") from None

    async def acknowledge(self, version: int, now: float) -> None:
        await self._client.hset(APPLIED, self.replica, f"{version} {now:.3f}")

    async def leave(self) -> None:
        await self._client.hdel(APPLIED, self.replica)

    async def applied(self, version: int, now: float, live_s: float) -> tuple[int, int]:
        """(replicas that applied `version` or later, replicas live): live ones acknowledged
        within `live_s`."""
        raw = await self._client.hgetall(APPLIED)
        done = live = 0
        for value in raw.values():
            text = value.decode() if isinstance(value, bytes) else str(value)
            seen_version, _, at = text.partition(" ")
            if now - float(at) > live_s:
                continue
            live += 1
            done += int(seen_version) >= version
        return done, live


def parse_records(raw: dict[Any, Any]) -> dict[str, KeyRecord]:
    """Redis's hash as records; a bad record is logged and left out (ten thousand take
    ~65 ms: the key store parses them in a worker thread)."""
    records: dict[str, KeyRecord] = {}
    for digest_raw, value in raw.items():
        digest = digest_raw.decode() if isinstance(digest_raw, bytes) else str(digest_raw)
        try:
            record = parse_key_record(json.loads(value), f"redis {RECORDS}[{digest[:12]}]")
        except (PolicyError, ValueError) as error:
            log.error("skipping a bad key record in Redis: %s", error)
            continue
        records[record.key_sha256] = record
    return records
