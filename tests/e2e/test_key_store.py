"""Keys managed without editing the policy, through real sidecars (issue 28 item 3).

Three `slogate serve` processes share one real Redis (`key_store: {redis: true}`) and are
driven over gRPC as Envoy drives them (tooling.benchmarks.driver). Keys are added with the
real CLI against one replica's admin API and revoked / rotated / expired through it; every
check asks every replica. Also: the key file's hot reload (a Kubernetes-Secret-style
symlink swap included) and the admin token.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from extproc.adminpb import admin_pb2 as pb
from extproc.adminpb import admin_pb2_grpc as pb_grpc
from extproc.runtime.processes import ManagedProcess, python_module
from tests.support.http import metric, scrape
from tooling.benchmarks.driver import DriverReply, SidecarDriver
from tooling.stack.processes import free_port, start_sidecar
from tooling.stack.redis import start_redis

TOKEN = "test-admin-token-0123456789"
POLL_S = 0.5
REPLICAS = 3
ALL_OK = ["ok"] * REPLICAS


def body() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def write_policy(path: Path, key_store: dict[str, object], redis_port: int | None) -> Path:
    policy: dict[str, object] = {
        "key_store": {"poll_interval_s": POLL_S, **key_store},
        "keys": [{"key": "sk-policy", "tenant": "policy-tenant", "tier": "standard"}],
    }
    if redis_port is not None:
        policy["budget"] = {
            "store": "redis",
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "redis_timeout_ms": 2000,
            "replicas": REPLICAS,
        }
    path.write_text(yaml.safe_dump(policy))
    return path


def slogate(*args: str, token_file: Path | None = None) -> dict[str, object]:
    """The real CLI; its JSON answer."""
    argv = [sys.executable, "-m", "tooling.cli.main", "keys", *args, "--json"]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


async def answers(drivers: list[SidecarDriver], key: str) -> list[DriverReply]:
    return list(await asyncio.gather(*(d.decide(key, body()) for d in drivers)))


def reasons(replies: list[DriverReply]) -> list[str]:
    """Each reply's 401 reason, or "ok": the key was accepted (no pool runs here, so what
    happens after identity — a 200, or the breaker shedding for want of engines — is not
    this test's business)."""
    return [r.headers.get("x-slogate-reason", "?") if r.status == 401 else "ok" for r in replies]


def test_add_revoke_rotate_expire_through_three_replicas_sharing_redis(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis_proc, redis_port = start_redis(tmp_path)
    processes.append(redis_proc)
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    policy = write_policy(tmp_path / "policy.yaml", {"redis": True}, redis_port)
    env = {"SLOGATE_ADMIN_TOKEN_FILE": str(token_file)}
    started = [start_sidecar(tmp_path, policy, f"sidecar{i}", env=env) for i in range(REPLICAS)]
    processes.extend(proc for proc, _ in started)
    admin = started[0][1].admin
    metadata = (("authorization", f"Bearer {TOKEN}"),)

    # Added with the CLI through replica 0: works through the others as soon as it returns.
    added = slogate("add", "--admin", admin, "--tenant", "acme", token_file=token_file)
    key = str(added["key"])
    assert added["replicasApplied"] == added["replicasLive"] == REPLICAS, added
    listed = slogate("list", "--admin", admin, token_file=token_file)
    assert [k["tenant"] for k in listed] == ["acme"]  # type: ignore[index]
    assert key not in json.dumps(listed)  # only its id is ever shown

    async def scenario() -> None:
        drivers = [SidecarDriver(f"127.0.0.1:{ports.grpc}") for _, ports in started]
        channel = grpc.aio.insecure_channel(admin)
        keys = pb_grpc.KeyAdminStub(channel)
        try:
            assert reasons(await answers(drivers, key)) == ALL_OK
            assert reasons(await answers(drivers, "sk-policy")) == ALL_OK
            # The real admin server asks for its token on every change, never on a read.
            for wrong in (None, (("authorization", "Bearer not-the-token-at-all"),)):
                await keys.ListKeys(pb.ListKeysRequest(), metadata=wrong)
                await pb_grpc.AdminStub(channel).Status(pb.StatusRequest(), metadata=wrong)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await keys.RevokeKey(pb.RevokeKeyRequest(key_id="0" * 12), metadata=wrong)
                assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert reasons(await answers(drivers, "sk-nobody")) == ["unknown_api_key"] * REPLICAS

            # Revoked: refused by both replicas, and by both as soon as the command returns.
            key_id = str(added["keys"][0]["keyId"])  # type: ignore[index]
            refused_at: list[float | None] = [None] * REPLICAS
            start = time.monotonic()

            async def watch(i: int) -> None:
                while refused_at[i] is None and time.monotonic() - start < 5:
                    reply = await drivers[i].decide(key, body())
                    if reply.headers.get("x-slogate-reason") == "revoked_api_key":
                        refused_at[i] = time.monotonic() - start
                    await asyncio.sleep(0.01)

            watchers = [asyncio.create_task(watch(i)) for i in range(REPLICAS)]
            change = await keys.RevokeKey(pb.RevokeKeyRequest(key_id=key_id), metadata=metadata)
            returned_s = time.monotonic() - start
            assert reasons(await answers(drivers, key)) == ["revoked_api_key"] * REPLICAS
            await asyncio.gather(*watchers)
            print(
                f"revocation: command returned after {returned_s:.3f} s (all replicas applied "
                f"in {change.propagation_s:.3f} s, {change.replicas_applied}/"
                f"{change.replicas_live}); refused by each replica after "
                + ", ".join(f"{at:.3f}" for at in refused_at if at is not None)
                + " s"
            )
            assert change.replicas_applied == change.replicas_live == REPLICAS
            assert all(at is not None and at < 2.0 for at in refused_at), refused_at
            refusal = (await drivers[1].decide(key, body())).status
            assert refusal == 401

            # Rotated with a 2 s grace: both keys work on both replicas, then only the new one.
            second = await keys.AddKey(
                pb.AddKeyRequest(key_sha256=_digest("sk-rotating"), tenant="acme", tier="critical"),
                metadata=metadata,
            )
            assert second.replicas_applied == REPLICAS
            rotated = await keys.RotateKey(
                pb.RotateKeyRequest(
                    key_id=second.keys[0].key_id, new_key_sha256=_digest("sk-rotated"), grace_s=2
                ),
                metadata=metadata,
            )
            assert [k.tier for k in rotated.keys] == ["critical", "critical"]
            assert reasons(await answers(drivers, "sk-rotating")) == ALL_OK
            assert reasons(await answers(drivers, "sk-rotated")) == ALL_OK
            await asyncio.sleep(2.1)
            assert reasons(await answers(drivers, "sk-rotating")) == ["expired_api_key"] * REPLICAS
            assert reasons(await answers(drivers, "sk-rotated")) == ALL_OK

            # Expiring: refused by both at its expiry, with no change travelling.
            await keys.AddKey(
                pb.AddKeyRequest(key_sha256=_digest("sk-brief"), tenant="brief", expires_in_s=1.5),
                metadata=metadata,
            )
            assert reasons(await answers(drivers, "sk-brief")) == ALL_OK
            await asyncio.sleep(1.6)
            assert reasons(await answers(drivers, "sk-brief")) == ["expired_api_key"] * REPLICAS

            # The store can revoke a key only the policy lists: its record wins.
            await keys.RevokeKey(
                pb.RevokeKeyRequest(key_id=_digest("sk-policy")[:12]), metadata=metadata
            )
            assert reasons(await answers(drivers, "sk-policy")) == ["revoked_api_key"] * REPLICAS
        finally:
            await channel.close()
            for driver in drivers:
                await driver.close()

    asyncio.run(scenario())
    text = scrape(f"http://127.0.0.1:{started[1][1].metrics}/metrics")
    assert metric(text, "slogate_key_store_keys", source="redis") == 5
    assert metric(text, "slogate_key_store_up", source="redis") == 1
    assert 0 <= metric(text, "slogate_key_store_sync_age_seconds", source="redis") < 2


def test_every_worker_of_serve_workers_applies_a_change(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    """`serve --workers 2`: worker 0 answers the admin API, each worker polls Redis itself."""
    redis_proc, redis_port = start_redis(tmp_path)
    processes.append(redis_proc)
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN)
    policy = write_policy(tmp_path / "policy.yaml", {"redis": True}, redis_port)
    grpc_port, admin_port = free_port(), free_port()
    argv = [
        *python_module("tooling.cli.main", "serve", "--policy", str(policy)),
        "--grpc-port", str(grpc_port), "--metrics-port", "0",
        "--admin-address", f"127.0.0.1:{admin_port}", "--no-exact-tokenizer", "--workers", "2",
    ]  # fmt: skip
    env = {"SLOGATE_ADMIN_TOKEN_FILE": str(token_file)}
    serve = ManagedProcess("serve", argv, tmp_path, env).start()
    processes.append(serve)
    serve.wait_for_line(r"ready: grpc \S+ metrics (\S+) admin", timeout_s=60)
    metadata = (("authorization", f"Bearer {TOKEN}"),)

    async def scenario() -> None:
        drivers = [SidecarDriver(f"127.0.0.1:{grpc_port}") for _ in range(8)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{admin_port}") as channel:
            keys = pb_grpc.KeyAdminStub(channel)
            added = await keys.AddKey(
                pb.AddKeyRequest(key_sha256=_digest("sk-worker"), tenant="w"), metadata=metadata
            )
            assert (added.replicas_applied, added.replicas_live) == (2, 2)
            replies = []
            for _ in range(4):  # connections spread over both workers by the kernel
                replies += await asyncio.gather(*(d.decide("sk-worker", body()) for d in drivers))
            assert reasons(replies) == ["ok"] * len(replies)
            owners = {r.tracking_id.split("-")[0] for r in replies if r.tracking_id}
            assert len(owners) == 2, owners  # both workers accepted the new key
            await keys.RevokeKey(
                pb.RevokeKeyRequest(key_id=added.keys[0].key_id), metadata=metadata
            )
            replies = []
            for _ in range(4):
                replies += await asyncio.gather(*(d.decide("sk-worker", body()) for d in drivers))
            assert reasons(replies) == ["revoked_api_key"] * len(replies)
        for driver in drivers:
            await driver.close()

    asyncio.run(scenario())


def test_the_key_file_is_hot_reloaded(tmp_path: Path, processes: list[ManagedProcess]) -> None:
    """A key file edited by `slogate keys --file`, then replaced as a Kubernetes Secret is
    (a `..data` symlink swapped to a new directory)."""
    secret = tmp_path / "secret"
    first = secret / "..2026_01"
    first.mkdir(parents=True)
    (secret / "..data").symlink_to(first.name)
    (secret / "keys.yaml").symlink_to("..data/keys.yaml")
    (first / "keys.yaml").write_text("version: 1\nkeys: []\n")
    policy = write_policy(tmp_path / "policy.yaml", {"file": str(secret / "keys.yaml")}, None)
    proc, ports = start_sidecar(tmp_path, policy, "sidecar")
    processes.append(proc)
    mine = tmp_path / "edited.yaml"
    added = slogate("add", "--file", str(mine), "--tenant", "filed")
    key = str(added["key"])

    async def scenario() -> None:
        driver = SidecarDriver(f"127.0.0.1:{ports.grpc}")
        try:
            assert reasons([await driver.decide(key, body())]) == ["unknown_api_key"]
            second = secret / "..2026_02"  # the Secret's update: a new directory, one swap
            second.mkdir()
            (second / "keys.yaml").write_text(mine.read_text())
            (secret / "..data_tmp").symlink_to(second.name)
            os.replace(secret / "..data_tmp", secret / "..data")
            assert await until(driver, key, "ok") < 2.0
            (second / "keys.yaml").write_text("keys: [{key: sk-clear, tenant: x}]\n")
            await asyncio.sleep(3 * POLL_S)  # a bad file is refused: the last keys stay
            assert reasons([await driver.decide(key, body())]) == ["ok"]
            (second / "keys.yaml").write_text(mine.read_text())
            key_id = str(added["keys"][0]["keyId"])  # type: ignore[index]
            slogate("revoke", "--file", str(second / "keys.yaml"), key_id)
            assert await until(driver, key, "revoked_api_key") < 2.0
        finally:
            await driver.close()

    asyncio.run(scenario())
    text = scrape(f"http://127.0.0.1:{ports.metrics}/metrics")
    assert metric(text, "slogate_key_store_errors_total", source="file") >= 1
    assert metric(text, "slogate_key_store_keys", source="file") == 1
    assert metric(text, "slogate_key_store_up", source="file") == 1


async def until(driver: SidecarDriver, key: str, reason: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < 5:
        if reasons([await driver.decide(key, body())]) == [reason]:
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"{key} never answered {reason}")


def _digest(key: str) -> str:
    from policy.domain import hash_api_key

    return hash_api_key(key)
