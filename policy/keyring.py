"""API keys managed outside the policy: records, the table they are looked up in, the file.

What lives here: `KeyRecord` (one key: its SHA-256, tenant, optional tier and limit
overrides, expiry, revocation), `KeyTable` (digest -> record, looked up against a time its
caller passes) and the key file's format (`parse_key_records` / `dump_key_records`). No I/O
and no clock of its own: the key store (extproc.runtime.key_store) reads the file or Redis
and passes the time, the CLI writes. A key's clear text never lives here: records hold its
SHA-256 only, and a file or Redis entry carrying a clear key is refused.

Expiry is decided at lookup from the time given, so an expired key is refused at that
instant by every replica, with no synchronisation; only revocation travels.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from policy._access import limit_overrides
from policy._reader import PolicyError, Section, expect
from policy.domain import ApiKey, Limits, TenantBook, Tier, build_caller, hash_api_key

KEY_ID_CHARS = 12  # what `slogate keys list` and the admin API show (ApiKey.key_id)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
CLEAR_KEY_PREFIX = "sk-slg-"


class KeyState(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"
    PENDING = "pending"  # not_before is still ahead


# The x-slogate-reason a refused key's 401 carries, per state.
REFUSAL_REASONS: Mapping[KeyState, str] = {
    KeyState.REVOKED: "revoked_api_key",
    KeyState.EXPIRED: "expired_api_key",
    KeyState.PENDING: "pending_api_key",
}


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One stored key. Times are Unix seconds (UTC); None: never. `tier` None: its
    tenant's tier (policy `tenants:`), else standard. `limits`: the fields it overrides."""

    key_sha256: str
    tenant: str
    tier: Tier | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    created_at: float = 0.0
    expires_at: float | None = None
    not_before: float | None = None
    revoked_at: float | None = None
    note: str = ""  # free text for operators ("rotated from 3f2a...")

    @property
    def key_id(self) -> str:
        return self.key_sha256[:KEY_ID_CHARS]

    def state(self, now: float) -> KeyState:
        if self.revoked_at is not None and self.revoked_at <= now:
            return KeyState.REVOKED
        if self.expires_at is not None and self.expires_at <= now:
            return KeyState.EXPIRED
        if self.not_before is not None and now < self.not_before:
            return KeyState.PENDING
        return KeyState.ACTIVE

    def caller(
        self, tier_limits: Mapping[Tier, Limits], tenants: TenantBook | None = None
    ) -> ApiKey:
        """The caller this key makes, by the rule every caller is made by
        (policy.domain.build_caller)."""
        return build_caller(
            self.key_sha256, self.tenant, self.tier, self.limits, tier_limits, tenants
        )

    def to_json(self, unix_times: bool = False) -> dict[str, Any]:
        """The record as the key file (ISO 8601 times) or Redis (`unix_times`) holds it."""
        out: dict[str, Any] = {"key_sha256": self.key_sha256, "tenant": self.tenant}
        if self.tier is not None:
            out["tier"] = self.tier.value
        if self.limits:
            out["limits"] = dict(self.limits)
        for name in ("created_at", "expires_at", "not_before", "revoked_at"):
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, 3) if unix_times else _iso(value)  # to the ms
        if self.note:
            out["note"] = self.note
        return out


def parse_key_record(raw: object, where: str) -> KeyRecord:
    """One record from a key file or a Redis entry; a clear key is refused."""
    if isinstance(raw, dict) and "key" in raw:
        raise PolicyError(
            f"{where}.key: clear-text keys are refused in a key store; store key_sha256 "
            '(echo -n "$KEY" | sha256sum), or let `slogate keys add` make the key'
        )
    sec = Section(raw, where)
    digest = sec.require("key_sha256", str).lower()
    if not _SHA256.match(digest):
        raise PolicyError(f"{sec.child('key_sha256')}: expected 64 hex characters")
    tenant = sec.require("tenant", str)
    if not tenant:
        raise PolicyError(f"{sec.child('tenant')}: must not be empty")
    tier_raw = sec.raw("tier")
    tier = None
    if tier_raw is not None:
        try:
            tier = Tier(expect(tier_raw, str, sec.child("tier")))
        except ValueError:
            allowed = ", ".join(t.value for t in Tier)
            raise PolicyError(f"{sec.child('tier')}: expected one of {allowed}") from None
    limits = parse_limit_overrides(sec.raw("limits"), sec.child("limits"))
    record = KeyRecord(
        key_sha256=digest,
        tenant=tenant,
        tier=tier,
        limits=limits,
        created_at=_time(sec.raw("created_at"), sec.child("created_at")) or 0.0,
        expires_at=_time(sec.raw("expires_at"), sec.child("expires_at")),
        not_before=_time(sec.raw("not_before"), sec.child("not_before")),
        revoked_at=_time(sec.raw("revoked_at"), sec.child("revoked_at")),
        note=sec.get("note", str, ""),
    )
    sec.close()
    return record


def parse_limit_overrides(raw: object, where: str) -> dict[str, int]:
    return {} if raw is None else limit_overrides(Section(raw, where))


def parse_key_records(raw: object, where: str = "") -> dict[str, KeyRecord]:
    """A key file: `{version: 1, keys: [record, ...]}` (YAML or JSON); an empty file is
    no keys. A digest listed twice is an error."""
    if raw is None:
        return {}
    sec = Section(raw, where)
    version = sec.get("version", int, 1)
    if version != 1:
        raise PolicyError(f"{sec.child('version')}: only version 1 is known")
    items = sec.get("keys", list, [])
    sec.close()
    records: dict[str, KeyRecord] = {}
    for i, item in enumerate(items):
        record = parse_key_record(item, f"{sec.child('keys')}[{i}]")
        if record.key_sha256 in records:
            raise PolicyError(f"{sec.child('keys')}[{i}]: key {record.key_id} is listed twice")
        records[record.key_sha256] = record
    return records


def dump_key_records(records: Iterable[KeyRecord]) -> dict[str, Any]:
    ordered = sorted(records, key=lambda r: (r.tenant, r.created_at, r.key_sha256))
    return {"version": 1, "keys": [r.to_json() for r in ordered]}


class KeyTable:
    """Digest -> record, frozen once built (a new table replaces it in one step)."""

    __slots__ = ("_records",)

    def __init__(self, records: Mapping[str, KeyRecord] | None = None) -> None:
        self._records: Mapping[str, KeyRecord] = dict(records or {})

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Any:
        return iter(self._records.values())

    def get(self, digest: str) -> KeyRecord | None:
        return self._records.get(digest)

    def lookup(self, digest: str, now: float) -> KeyRecord | str | None:
        """The record of an active key; the refusal reason (`revoked_api_key`, ...) of a
        known key that may not be used at `now`; None for a key this table does not hold."""
        record = self._records.get(digest)
        if record is None:
            return None
        state = record.state(now)
        return record if state is KeyState.ACTIVE else REFUSAL_REASONS[state]

    def find(self, key_id: str) -> KeyRecord:
        """The one record whose digest starts with `key_id` (at least 8 hex digits)."""
        key_id = key_id.lower()
        if len(key_id) < 8 or not re.fullmatch(r"[0-9a-f]+", key_id):
            raise KeyError(f"{key_id!r}: a key id is at least 8 hex digits of its SHA-256")
        found = [r for d, r in self._records.items() if d.startswith(key_id)]
        if not found:
            raise KeyError(f"no stored key with id {key_id}")
        if len(found) > 1:
            raise KeyError(f"key id {key_id} names {len(found)} keys; give more digits")
        return found[0]

    def active(self, now: float) -> int:
        return sum(1 for r in self._records.values() if r.state(now) is KeyState.ACTIVE)


def merged(records: Mapping[str, KeyRecord], written: Iterable[KeyRecord]) -> dict[str, KeyRecord]:
    """`records` with `written` over them, each keeping the stricter revocation and expiry
    of the stored and the written record: records only ever get shorter-lived, so a write
    made from a stale copy never undoes a revocation (the Redis script does the same)."""
    out = dict(records)
    for new in written:
        old = out.get(new.key_sha256)
        if old is not None:
            new = dataclasses.replace(
                new,
                revoked_at=_earliest(old.revoked_at, new.revoked_at),
                expires_at=_earliest(old.expires_at, new.expires_at),
            )
        out[new.key_sha256] = new
    return out


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def revoked(record: KeyRecord, now: float) -> KeyRecord:
    return dataclasses.replace(record, revoked_at=now)


def rotated(
    old: KeyRecord, new_digest: str, now: float, grace_s: float
) -> tuple[KeyRecord, KeyRecord]:
    """Rotation: a new key with the old one's tenant, tier, limits and expiry, and the old
    key expiring after `grace_s` (never later than it would have anyway)."""
    new = dataclasses.replace(
        old,
        key_sha256=new_digest,
        created_at=now,
        not_before=None,
        revoked_at=None,
        note=f"rotated from {old.key_id}",
    )
    ends = now + grace_s
    if old.expires_at is not None:
        ends = min(ends, old.expires_at)
    return dataclasses.replace(old, expires_at=ends), new


def new_clear_key() -> tuple[str, str]:
    """A fresh key and its SHA-256: 256 random bits, printed once, stored as the digest."""
    clear = CLEAR_KEY_PREFIX + secrets.token_urlsafe(32)
    return clear, hash_api_key(clear)


def parse_duration_s(text: str) -> float:
    """`90`, `30s`, `15m`, `24h`, `30d`, `2w` -> seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r}: expected a duration like 30s, 15m, 24h, 30d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds")


def _time(raw: object, where: str) -> float | None:
    """A time: Unix seconds, or an ISO 8601 string (UTC unless it names its offset)."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise PolicyError(f"{where}: expected a time")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, datetime):  # YAML reads an unquoted timestamp as one
        moment = raw
    elif isinstance(raw, str):
        try:
            moment = datetime.fromisoformat(raw)
        except ValueError:
            raise PolicyError(f"{where}: expected an ISO 8601 time, got {raw!r}") from None
    else:
        raise PolicyError(f"{where}: expected a time")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
