"""The key store with a real Redis-compatible server (single and cluster): Redis shared by two
stores as two replicas, a replica that stops answering, Redis away. The rest:
tests/extproc/runtime/test_key_store.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from budget.redis_store import connect
from extproc.runtime.key_store import KeyStore, RedisKeys
from policy._keystore import KeyStoreConfig
from policy.domain import hash_api_key
from policy.keyring import revoked, rotated
from tests.support.keys import POLICY, record
from tooling.stack.redis import start_redis


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
