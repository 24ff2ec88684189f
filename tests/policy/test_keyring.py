"""The key store's pure part (policy.keyring) and its policy section: records, lookups
against a given time, rotation, the key file's format; no I/O."""

from __future__ import annotations

import pytest

from policy._reader import PolicyError
from policy.domain import Limits, Tier, hash_api_key
from policy.keyring import (
    KeyRecord,
    KeyState,
    KeyTable,
    dump_key_records,
    merged,
    parse_duration_s,
    parse_key_records,
    revoked,
    rotated,
)
from policy.loader import parse_policy

DIGEST = hash_api_key("sk-one")
OTHER = hash_api_key("sk-two")


def record(**changes: object) -> KeyRecord:
    fields: dict[str, object] = {"key_sha256": DIGEST, "tenant": "acme", "created_at": 100.0}
    fields.update(changes)
    return KeyRecord(**fields)  # type: ignore[arg-type]


def test_lookup_answers_the_record_or_why_it_is_refused() -> None:
    table = KeyTable({DIGEST: record(expires_at=200.0, revoked_at=None)})
    assert table.lookup(DIGEST, 150.0) == record(expires_at=200.0)
    assert table.lookup(DIGEST, 200.0) == "expired_api_key"  # expiry is at the instant
    assert table.lookup(OTHER, 150.0) is None
    gone = KeyTable({DIGEST: revoked(record(), 120.0)})
    assert gone.lookup(DIGEST, 119.0) == record(revoked_at=120.0)
    assert gone.lookup(DIGEST, 120.0) == "revoked_api_key"
    pending = KeyTable({DIGEST: record(not_before=300.0)})
    assert pending.lookup(DIGEST, 299.0) == "pending_api_key"
    assert pending.lookup(DIGEST, 300.0) == record(not_before=300.0)


def test_a_write_never_lengthens_a_stored_life() -> None:
    stored = {DIGEST: record(revoked_at=120.0, expires_at=500.0)}
    stale = record(expires_at=300.0)  # rotated from a copy read before the revocation
    (kept,) = merged(stored, [stale]).values()
    assert (kept.revoked_at, kept.expires_at) == (120.0, 300.0)
    fresh = merged({}, [stale])
    assert fresh[DIGEST] == stale


def test_revocation_wins_over_expiry() -> None:
    both = record(expires_at=150.0, revoked_at=110.0)
    assert both.state(160.0) is KeyState.REVOKED


def test_rotation_keeps_the_old_key_for_the_grace_only() -> None:
    old = record(tier=Tier.CRITICAL, limits={"requests_per_minute": 5}, expires_at=10_000.0)
    kept, new = rotated(old, OTHER, now=1_000.0, grace_s=60.0)
    assert kept.expires_at == 1_060.0
    assert (new.key_sha256, new.tenant, new.tier, new.limits) == (
        OTHER,
        "acme",
        Tier.CRITICAL,
        {"requests_per_minute": 5},
    )
    assert new.expires_at == 10_000.0 and new.created_at == 1_000.0
    table = KeyTable({kept.key_sha256: kept, new.key_sha256: new})
    assert isinstance(table.lookup(DIGEST, 1_059.0), KeyRecord)
    assert table.lookup(DIGEST, 1_060.0) == "expired_api_key"
    assert isinstance(table.lookup(OTHER, 1_060.0), KeyRecord)
    # A grace past the old key's own expiry does not lengthen its life.
    assert rotated(old, OTHER, now=9_990.0, grace_s=60.0)[0].expires_at == 10_000.0


def test_a_stored_key_inherits_its_tier_and_overrides_limits() -> None:
    tiers = {
        Tier.STANDARD: Limits(requests_per_minute=300, tokens_per_minute=1000),
        Tier.CRITICAL: Limits(requests_per_minute=600),
    }
    plain = record().caller(tiers)
    assert plain.tier is Tier.STANDARD and plain.limits == tiers[Tier.STANDARD]
    own = record(tier=Tier.CRITICAL, limits={"tokens_per_minute": 7}).caller(tiers)
    assert own.tier is Tier.CRITICAL
    assert own.limits == Limits(requests_per_minute=600, tokens_per_minute=7)
    assert own.key_id == DIGEST[:12] and own.tenant == "acme"


def test_a_stored_key_inherits_from_its_policy_tenant() -> None:
    policy = parse_policy(
        {"tenants": {"list": {"acme": {"tier": "critical", "limits": {"tokens_per_minute": 9}}}}}
    )
    caller = record().caller(policy.tier_limits, policy.tenants)
    assert caller.tier is Tier.CRITICAL and caller.limits.tokens_per_minute == 9


def test_the_key_file_round_trips_and_refuses_clear_keys() -> None:
    records = {
        DIGEST: record(tier=Tier.SHEDDABLE, limits={"concurrent_requests": 2}, expires_at=5e9),
        OTHER: record(key_sha256=OTHER, tenant="beta", revoked_at=150.0, note="leaked"),
    }
    dumped = dump_key_records(records.values())
    assert parse_key_records(dumped) == records
    assert "sk-one" not in str(dumped)
    with pytest.raises(PolicyError, match=r"keys\[0\]\.key: clear-text keys are refused"):
        parse_key_records({"keys": [{"key": "sk-one", "tenant": "acme"}]})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"keys": [{"key_sha256": "abc", "tenant": "a"}]}, r"keys\[0\]\.key_sha256: expected 64"),
        ({"keys": [{"key_sha256": DIGEST}]}, r"keys\[0\]\.tenant: required"),
        ({"keys": [{"key_sha256": DIGEST, "tenant": "a", "tier": "gold"}]}, r"keys\[0\]\.tier"),
        ({"keys": [{"key_sha256": DIGEST, "tenant": "a", "expires_at": "soon"}]}, "ISO 8601"),
        ({"keys": [{"key_sha256": DIGEST, "tenant": "a", "colour": 1}]}, r"colour: unknown"),
        (
            {"keys": [{"key_sha256": DIGEST, "tenant": "a", "limits": {"rpm": 1}}]},
            r"limits\.rpm: unknown",
        ),
        (
            {
                "keys": [
                    {"key_sha256": DIGEST, "tenant": "a"},
                    {"key_sha256": DIGEST, "tenant": "b"},
                ]
            },
            "listed twice",
        ),
        ({"version": 2}, "version"),
    ],
)
def test_a_bad_key_file_names_the_bad_field(raw: object, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_key_records(raw)


def test_times_read_as_iso_or_unix_seconds() -> None:
    (only,) = parse_key_records(
        {
            "keys": [
                {
                    "key_sha256": DIGEST,
                    "tenant": "a",
                    "expires_at": "2030-01-01T00:00:00Z",
                    "created_at": 12,
                }
            ]
        }
    ).values()
    assert only.expires_at == 1893456000.0 and only.created_at == 12.0


def test_find_by_key_id_prefix() -> None:
    table = KeyTable({DIGEST: record(), OTHER: record(key_sha256=OTHER)})
    assert table.find(DIGEST[:8]).key_sha256 == DIGEST
    with pytest.raises(KeyError, match="at least 8"):
        table.find(DIGEST[:4])
    with pytest.raises(KeyError, match="no stored key"):
        table.find("00000000")


def test_durations() -> None:
    assert parse_duration_s("30d") == 30 * 86400
    assert parse_duration_s("1.5h") == 5400
    assert parse_duration_s("90") == 90
    with pytest.raises(ValueError):
        parse_duration_s("soon")


def test_the_key_store_section() -> None:
    policy = parse_policy(
        {
            "budget": {"store": "redis"},
            "key_store": {"file": "/etc/slogate/keys.yaml", "redis": True, "poll_interval_s": 0.25},
        }
    )
    assert policy.key_store.file == "/etc/slogate/keys.yaml" and policy.key_store.redis
    assert policy.key_store.poll_interval_s == 0.25
    with pytest.raises(PolicyError, match=r"key_store\.redis: needs budget\.store: redis"):
        parse_policy({"key_store": {"redis": True}})
    with pytest.raises(PolicyError, match=r"key_store\.colour: unknown field"):
        parse_policy({"key_store": {"colour": 1}})
    with pytest.raises(PolicyError, match=r"key_store\.poll_interval_s: must be > 0"):
        parse_policy({"key_store": {"file": "k.yaml", "poll_interval_s": 0}})
