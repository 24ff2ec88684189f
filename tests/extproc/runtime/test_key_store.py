"""The key store in-process (extproc.runtime.key_store): the key file written and re-read,
store records against the policy's keys, a bad key file. Real files; the request path's
lookup as the sidecar makes it. Redis shared by two stores as two replicas, a replica that
stops answering, Redis away: tests/e2e/extproc/runtime/test_key_store.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from extproc.runtime.key_store import KeyStore, read_key_file
from extproc.service.key_admin import KeyStoreError
from policy._keystore import KeyStoreConfig
from policy.domain import Tier, hash_api_key
from policy.keyring import revoked, rotated
from policy.loader import parse_policy
from tests.support.keys import POLICY, record


def test_a_sidecar_with_a_key_file_writes_it_and_sees_its_change(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"

    async def scenario() -> None:
        store = KeyStore(KeyStoreConfig(file=str(path)), None)
        await store.sync()
        assert store.writable == "file"
        assert store.caller(hash_api_key("sk-a"), POLICY) is None
        spread = await store.put(record("sk-a", tier=Tier.CRITICAL))
        assert (spread.applied, spread.live) == (1, 1)
        caller = store.caller(hash_api_key("sk-a"), POLICY)
        assert caller is not None and not isinstance(caller, str)
        assert caller.tier is Tier.CRITICAL and caller.tenant == "acme"
        assert list(read_key_file(path)) == [hash_api_key("sk-a")]
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        # Another writer (the CLI, a Secret update) replaces the file: seen at the next sync.
        other = KeyStore(KeyStoreConfig(file=str(path)), None)
        await other.put(revoked(store.find(hash_api_key("sk-a")[:8]), time.time()))
        await store.sync()
        assert store.caller(hash_api_key("sk-a"), POLICY) == "revoked_api_key"

    asyncio.run(scenario())


def test_a_store_record_wins_over_the_policy_entry(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"

    async def scenario() -> None:
        store = KeyStore(KeyStoreConfig(file=str(path)), None)
        policy_key = POLICY.key_for("sk-policy")
        assert policy_key is not None
        await store.put(record("sk-policy", tenant="moved", revoked_at=time.time() + 60))
        found = store.caller(hash_api_key("sk-policy"), POLICY)
        assert found is not None and not isinstance(found, str) and found.tenant == "moved"

    asyncio.run(scenario())


def test_a_new_key_names_a_tenant_the_policy_takes(tmp_path: Path) -> None:
    listed = parse_policy({"tenants": {"list": {"acme": {"tier": "critical"}}}})
    store = KeyStore(KeyStoreConfig(file=str(tmp_path / "k.yaml")), None, policy=lambda: listed)
    assert store.tenant_problem("acme") is None
    assert "no tenant named 'beta'" in str(store.tenant_problem("beta"))
    open_book = parse_policy({"tenants": {"defaults": {"tier": "standard"}}})
    store = KeyStore(KeyStoreConfig(file=str(tmp_path / "k.yaml")), None, policy=lambda: open_book)
    assert store.tenant_problem("beta") is None


def test_a_key_only_the_policy_lists_can_be_revoked_or_rotated_by_its_id(tmp_path: Path) -> None:
    policy = parse_policy(
        {"keys": [{"key": "sk-policy", "tenant": "p", "limits": {"requests_per_minute": 7}}]}
    )

    async def scenario() -> None:
        store = KeyStore(KeyStoreConfig(file=str(tmp_path / "k.yaml")), None, policy=lambda: policy)
        digest = hash_api_key("sk-policy")
        assert store.caller(digest, policy) is None  # the policy's entry answers
        old, new = rotated(store.find(digest[:10]), hash_api_key("sk-new"), time.time(), 0.3)
        await store.put(old, new)
        for key in ("sk-policy", "sk-new"):
            caller = store.caller(hash_api_key(key), policy)
            assert caller is not None and not isinstance(caller, str)
            assert (caller.tenant, caller.limits.requests_per_minute) == ("p", 7)
        await asyncio.sleep(0.3)
        assert store.caller(digest, policy) == "expired_api_key"
        with pytest.raises(KeyStoreError, match="no stored key"):
            store.find("0123456789")

    asyncio.run(scenario())


def test_a_bad_key_file_keeps_the_last_keys_and_reads_down_until_fixed(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    path = tmp_path / "keys.yaml"
    registry = CollectorRegistry()

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"source": "file"})

    async def scenario() -> None:
        store = KeyStore(KeyStoreConfig(file=str(path)), None, registry)
        await store.put(record("sk-kept"))
        assert sample("slogate_key_store_up") == 1
        path.write_text("keys: [{key: sk-clear, tenant: x}]\n")
        for _ in range(3):  # polls of an unchanged bad file: still down, counted once
            await store.sync()
        assert sample("slogate_key_store_up") == 0
        assert sample("slogate_key_store_errors_total") == 1
        assert store.caller(hash_api_key("sk-kept"), POLICY) is not None
        path.write_text("version: 1\nkeys: []\n")
        await store.sync()
        assert sample("slogate_key_store_up") == 1 and sample("slogate_key_store_keys") == 0
        assert store.caller(hash_api_key("sk-kept"), POLICY) is None

    asyncio.run(scenario())
