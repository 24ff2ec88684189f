"""The key store: API keys managed without editing the policy, in a file and in Redis.

What lives here: `KeyStore`, the request path's view of the stored keys (the `StoredKeys`
protocol of extproc.request.identity: a dictionary lookup, no I/O per request) and the
loop that keeps it current; and the key file's reading and atomic writing. The keys in
Redis are extproc.runtime.key_redis; the records and their rules are policy.keyring.

How a change reaches every replica (and every worker of `serve --workers N`): each one
polls every `key_store.poll_interval_s` (0.5 s) — the file's stat (a Kubernetes Secret
update swaps a symlink, so the path is stat'ed, not the inode opened), Redis's change
counter — and swaps in a new table in one step; the file is parsed off the event loop.
Each replica writes the counter value it applied, with the time, to a Redis hash; an admin
change answers once every live replica (one that acknowledged within the last few polls)
applied it, so a key added on one replica works on all of them when the command returns,
and the answer says how long revocation took to reach the last one.

Which wins: a Redis record over a file record over the policy's `keys:` entry, for the same
digest — so the store can revoke or expire a key the policy lists. Times are Unix seconds
from this host's clock (expiry is decided at lookup: keep the hosts' clocks in NTP sync).
While Redis is unreachable each replica keeps the keys it last read (`slogate_key_store_up
{source="redis"} 0`): revocations made then reach it when Redis answers again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge

from budget.redis_store import connect
from extproc.runtime.heap import off_loop
from extproc.runtime.key_redis import RedisKeys, parse_records
from extproc.service.key_admin import KeyStoreError, Propagation
from policy._keystore import KeyStoreConfig
from policy._reader import PolicyError
from policy.domain import LIMIT_FIELDS, ApiKey
from policy.keyring import (
    KeyRecord,
    KeyTable,
    dump_key_records,
    merged,
    parse_key_records,
)
from policy.schema import Policy

log = logging.getLogger("slogate.keys")

_REDIS_POLL_TIMEOUT_S = 1.0  # a hung Redis must not stop the file's polls
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_key_file(path: Path) -> dict[str, KeyRecord]:
    """The records of a key file (YAML or JSON); a missing or empty file is no keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        raw = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as error:
        raise PolicyError(f"{path}: not valid YAML or JSON: {error}") from None
    return parse_key_records(raw, "")


def write_key_file(path: Path, records: dict[str, KeyRecord]) -> None:
    """Replace the file in one step (a reader sees the old file or the new one), mode 0600."""
    text = yaml.safe_dump(dump_key_records(records.values()), sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class _Metrics:
    def __init__(self, registry: CollectorRegistry, store: KeyStore) -> None:
        self.keys = Gauge(
            "slogate_key_store_keys",
            "Keys in the key store (any state), by source",
            ["source"],
            registry=registry,
        )
        self.up = Gauge(
            "slogate_key_store_up",
            "1 when the key store's last read from the source succeeded",
            ["source"],
            registry=registry,
        )
        self.errors = Counter(
            "slogate_key_store_errors_total",
            "Key store reads that failed (the last good keys stay)",
            ["source"],
            registry=registry,
        )
        age = Gauge(
            "slogate_key_store_sync_age_seconds",
            "Seconds since the key store last read its sources successfully",
            ["source"],
            registry=registry,
        )
        for source in ("file", "redis"):
            age.labels(source).set_function(functools.partial(store.sync_age_s, source))


class KeyStore:
    """The stored keys as the request path sees them, kept current by `run()`."""

    def __init__(
        self,
        config: KeyStoreConfig,
        redis: RedisKeys | None,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        policy: Callable[[], Policy] | None = None,
    ) -> None:
        """`policy`: the active policy, whose keys a revocation or rotation may name."""
        self.config = config
        self._policy = policy
        self._redis = redis
        self._path = Path(config.file) if config.file else None
        self._wall = wall_clock
        self._file_table = KeyTable()
        self._redis_table = KeyTable()
        self._file_stat: tuple[int, int, int] | None = None
        self._version = -1
        self._synced: dict[str, float] = {}
        self._healthy: dict[str, bool] = {}
        self._callers: dict[str, ApiKey] = {}
        self._callers_for: Policy | None = None
        self._write_lock = asyncio.Lock()
        self._metrics = _Metrics(registry, self) if registry is not None else None

    # -- the request path ---------------------------------------------------------------

    def caller(self, key_sha256: str, policy: Policy) -> ApiKey | str | None:
        now = self._wall()
        for table in (self._redis_table, self._file_table):
            found = table.lookup(key_sha256, now)
            if found is None:
                continue
            if isinstance(found, str):
                return found
            if policy is not self._callers_for:  # a reload may change tiers' limits
                self._callers, self._callers_for = {}, policy
            caller = self._callers.get(key_sha256)
            if caller is None:
                caller = found.caller(policy.tier_limits, policy.tenants)
                self._callers[key_sha256] = caller
            return caller
        return None

    # -- keeping current -------------------------------------------------------------------

    def sync_age_s(self, source: str) -> float:
        at = self._synced.get(source)
        return -1.0 if at is None else self._wall() - at

    def tables(self) -> dict[str, KeyTable]:
        return {"redis": self._redis_table, "file": self._file_table}

    async def run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.config.poll_interval_s)

    async def sync(self) -> None:
        """One poll of every source; a failing source keeps its last keys."""
        if self._path is not None:
            await self._sync_file(self._path)
        if self._redis is not None:
            try:
                await asyncio.wait_for(self._sync_redis(self._redis), _REDIS_POLL_TIMEOUT_S)
            except TimeoutError:
                log.warning("key store: Redis did not answer within %.1f s", _REDIS_POLL_TIMEOUT_S)
                self._note("redis", False)

    async def _sync_file(self, path: Path) -> None:
        stat = _stat(path)
        if stat != self._file_stat:
            self._file_stat = stat  # a bad file is read (and counted) once per change
            try:
                records = await off_loop(read_key_file, path)
            except (PolicyError, OSError) as error:
                log.error("key file %s refused, keeping its last keys: %s", path, error)
                self._note("file", False)
                return
            self._file_table = KeyTable(records)  # the swap: one reference
            self._callers = {}
            log.info("key file %s: %d keys", path, len(records))
            self._note("file", True)
        elif self._healthy.get("file", True):
            self._note("file", True)

    async def _sync_redis(self, redis: RedisKeys) -> None:
        try:
            version = await redis.version()
            if version != self._version:
                raw = await redis.raw_records()
                self._redis_table = KeyTable(await off_loop(parse_records, raw))
                self._callers = {}
                self._version = version
            await redis.acknowledge(self._version, self._wall())
        except Exception as error:  # redis-py's errors, timeouts: keep the last keys
            if self._healthy.get("redis", True):
                log.warning("key store: Redis unreadable, keeping its last keys: %s", error)
            self._note("redis", False)
            return
        if not self._healthy.get("redis", True):
            log.info("key store: Redis answers again (%d keys)", len(self._redis_table))
        self._note("redis", True)

    def _note(self, source: str, ok: bool) -> None:
        """A read of `source` ended: `ok`, or failed (its last keys stay)."""
        self._healthy[source] = ok
        if ok:
            self._synced[source] = self._wall()
        if self._metrics is None:
            return
        table = self._file_table if source == "file" else self._redis_table
        self._metrics.up.labels(source).set(1 if ok else 0)
        self._metrics.keys.labels(source).set(len(table))
        if not ok:
            self._metrics.errors.labels(source).inc()

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.leave()
            except Exception:
                log.debug("key store: could not leave the acknowledgements", exc_info=True)

    # -- changes (the admin API) ---------------------------------------------------------

    @property
    def writable(self) -> str | None:
        """Where changes go: "redis", "file", or None (no store to write)."""
        if self._redis is not None:
            return "redis"
        return "file" if self._path is not None else None

    def records(self) -> list[tuple[str, KeyRecord]]:
        """(source, record) of every stored key, the winning one per digest."""
        seen: dict[str, tuple[str, KeyRecord]] = {}
        for source, table in (("file", self._file_table), ("redis", self._redis_table)):
            for record in table:
                seen[record.key_sha256] = (source, record)
        return list(seen.values())

    def find(self, key_id: str) -> KeyRecord:
        table = self._redis_table if self._redis is not None else self._file_table
        try:
            return table.find(key_id)
        except KeyError as error:
            adopted = self._policy_key(key_id)
            if adopted is None:
                raise KeyStoreError(str(error.args[0])) from None
            return adopted

    def tenant_problem(self, tenant: str) -> str | None:
        """Why a new key may not name `tenant`: as for the policy's keys, a policy with a
        `tenants:` section and no `defaults` takes only the tenants it lists."""
        if self._policy is None:
            return None
        book = self._policy().tenants
        if book.listed and book.default is None and tenant not in book.listed:
            return f"tenant: no tenant named {tenant!r} in the policy's tenants.list"
        return None

    def _policy_key(self, key_id: str) -> KeyRecord | None:
        """A key only the policy lists, as a store record (its tenant, tier and limits):
        revoking or rotating it writes that record, which then wins over the policy's."""
        key_id = key_id.lower()
        if self._policy is None or len(key_id) < 8:
            return None
        found = [k for d, k in self._policy().keys.items() if d.startswith(key_id)]
        if len(found) != 1:
            return None
        (key,) = found
        limits = {f: getattr(key.limits, f) for f in LIMIT_FIELDS}
        return KeyRecord(
            key_sha256=key.key_sha256,
            tenant=key.tenant,
            tier=key.tier,
            limits={f: v for f, v in limits.items() if v is not None},
            created_at=self._wall(),
            note="from the policy",
        )

    async def put(self, *records: KeyRecord) -> Propagation:
        """Store `records` and wait until every live replica applied them (Redis), or
        until this one did (the file: other replicas see it at their next poll)."""
        started = time.monotonic()
        async with self._write_lock:
            if self._redis is not None:
                version = await self._redis.put(*records)
                await self._sync_redis(self._redis)
                return await self._propagated(self._redis, version, started)
            if self._path is None:
                raise KeyStoreError(
                    "this sidecar has no key store to write: set key_store.redis (with "
                    "budget.store: redis) or key_store.file in the policy"
                )
            current = await asyncio.to_thread(read_key_file, self._path)
            current = merged(current, records)
            await asyncio.to_thread(write_key_file, self._path, current)
            await self._sync_file(self._path)
            return Propagation(1, 1, time.monotonic() - started)

    async def _propagated(self, redis: RedisKeys, version: int, started: float) -> Propagation:
        # A replica is live when it acknowledged within four polls (and at least 2 s).
        live_s = max(2.0, 4 * self.config.poll_interval_s)
        deadline = started + self.config.propagation_timeout_s
        while True:
            done, live = await redis.applied(version, self._wall(), live_s)
            if done >= live or time.monotonic() >= deadline:
                return Propagation(done, live, time.monotonic() - started)
            await asyncio.sleep(0.02)


def build_key_store(
    active: Callable[[], Policy], registry: CollectorRegistry | None
) -> KeyStore | None:
    """The store the policy asks for (None: `key_store:` is not set). Redis: the budget
    store's, with its connection settings, on a small connection pool of its own."""
    policy = active()
    config = policy.key_store
    if not config.enabled:
        return None
    redis = None
    if config.redis:
        url = os.environ.get("SLOGATE_REDIS_URL") or policy.budget.redis_url
        redis_client = connect(url, policy.budget.redis_cluster, max_connections=4)
        redis = RedisKeys(
            redis_client, f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
    return KeyStore(config, redis, registry, policy=active)


def _stat(path: Path) -> tuple[int, int, int]:
    """What tells a changed file: a Secret update swaps a symlink (a new inode), an edit
    in place changes its time or size. (0, 0, 0): no file."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_ino, st.st_size)
