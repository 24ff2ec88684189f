"""The key store in-process (extproc.runtime.key_store): the key file written and re-read,
Redis shared by two stores as two replicas, a replica that stops answering, Redis away.
Real files and a real Redis-compatible server; the request path's lookup as the sidecar
makes it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from budget.redis_store import connect
from extproc.runtime.key_store import KeyStore, RedisKeys, read_key_file
from extproc.service.key_admin import KeyStoreError
from policy import Tier, hash_api_key, parse_policy
from policy._keystore import KeyStoreConfig
from policy.keyring import KeyRecord, revoked, rotated
from tooling.stack.redis import start_redis

POLICY = parse_policy({"keys": [{"key": "sk-policy", "tenant": "p"}]})


def record(key: str, **changes: object) -> KeyRecord:
    fields: dict[str, object] = {
        "key_sha256": hash_api_key(key),
        "tenant": "acme",
        "created_at": time.time(),
    }
    fields.update(changes)
    return KeyRecord(**fields)  # type: ignore[arg-type]


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


@pytest.mark.e2e
def test_two_replicas_share_redis_and_keep_their_keys_while_it_is_away(tmp_path: Path) -> None:
    proc, port = start_redis(tmp_path)
    config = KeyStoreConfig(redis=True, poll_interval_s=0.1, propagation_timeout_s=1.0)

    async def scenario() -> None:
        clients = [connect(f"redis://127.0.0.1:{port}/0") for _ in range(3)]
        one, two, gone = (
            KeyStore(config, RedisKeys(c, f"replica-{i}")) for i, c in enumerate(clients)
        )
        for store in (one, two, gone):
            await store.sync()
        polling = asyncio.create_task(two.run())
        try:
            # The third replica stops polling: it holds up a change until the timeout only
            # while its last acknowledgement is recent (4 polls, 2 s at least) ...
            spread = await one.put(record("sk-one"))
            assert (spread.applied, spread.live) == (2, 3) and spread.seconds >= 1.0
            assert not isinstance(two.caller(hash_api_key("sk-one"), POLICY), str | None)
            # ... then it no longer counts as live.
            await asyncio.sleep(2.1)
            spread = await one.put(record("sk-two"))
            assert (spread.applied, spread.live) == (2, 2) and spread.seconds < 1.0
            await gone.close()
            # Redis away: each keeps the keys it read, a revocation waits for Redis.
            proc.stop()
            await asyncio.sleep(0.3)
            assert two.caller(hash_api_key("sk-two"), POLICY) is not None
            await two.sync()
            assert not isinstance(two.caller(hash_api_key("sk-two"), POLICY), str | None)
            assert two.sync_age_s("redis") > 0.2
        finally:
            polling.cancel()
            for client in clients:
                await client.aclose()

    try:
        asyncio.run(scenario())
    finally:
        proc.stop()


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


@pytest.mark.e2e
def test_a_write_from_a_stale_copy_never_undoes_a_revocation(tmp_path: Path) -> None:
    """Replica B rotates a key from its copy of 0.1 s ago, after replica A revoked it: the
    revocation stays (the script keeps the stricter revocation and expiry)."""
    proc, port = start_redis(tmp_path)

    async def scenario() -> None:
        client = connect(f"redis://127.0.0.1:{port}/0")
        keys = RedisKeys(client, "a")
        try:
            key = record("sk-raced", expires_at=time.time() + 3600)
            await keys.put(key)
            await keys.put(revoked(key, time.time()))
            stale_old, new = rotated(key, hash_api_key("sk-next"), time.time(), grace_s=60)
            await keys.put(stale_old, new)
            stored = await keys.records()
            assert stored[key.key_sha256].revoked_at is not None
            assert stored[key.key_sha256].expires_at == pytest.approx(
                stale_old.expires_at, abs=1e-3
            )
            assert stored[new.key_sha256].revoked_at is None
            assert await keys.version() == 3
        finally:
            await client.aclose()

    try:
        asyncio.run(scenario())
    finally:
        proc.stop()


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


@pytest.mark.e2e
@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "cluster"])
def test_two_stores_share_keys_through_redis_and_a_cluster(
    cluster: bool, request: pytest.FixtureRequest
) -> None:
    """The records, the counter and the acknowledgements share one hash tag: a Redis Cluster
    serves them as one server does (every script and command on one slot)."""
    port = request.getfixturevalue("cluster_ports")[0] if cluster else None
    if port is None:
        port = request.getfixturevalue("redis_port")
    config = KeyStoreConfig(redis=True, poll_interval_s=0.05)

    async def scenario() -> None:
        url = f"redis://127.0.0.1:{port}/0" if not cluster else f"redis://127.0.0.1:{port}"
        clients = [connect(url, cluster=cluster) for _ in range(2)]
        await clients[0].delete(
            *(f"slogate:{{keys}}:{k}" for k in ("records", "version", "applied"))
        )
        one, two = (KeyStore(config, RedisKeys(c, f"r{i}")) for i, c in enumerate(clients))
        polling = asyncio.create_task(two.run())
        try:
            await one.sync()
            await asyncio.sleep(0.1)
            spread = await one.put(record("sk-shared"))
            assert (spread.applied, spread.live) == (2, 2)
            found = two.caller(hash_api_key("sk-shared"), POLICY)
            assert found is not None and not isinstance(found, str)
            await one.put(revoked(one.find(hash_api_key("sk-shared")[:8]), time.time()))
            assert two.caller(hash_api_key("sk-shared"), POLICY) == "revoked_api_key"
        finally:
            polling.cancel()
            for client in clients:
                await client.aclose()

    asyncio.run(scenario())
