"""`slogate serve --workers N`: N sidecar processes behind one gRPC port, one /metrics, one
admin API, every request settled by the worker that decided it; their logs and a worker's
death on standard output. In process: tests/extproc/runtime/test_supervisor.py."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from budget.redis_store import connect
from extproc.adminpb import admin_pb2, admin_pb2_grpc
from extproc.runtime.processes import ManagedProcess, python_module
from extproc.service import admin_client
from extproc.service.admin_auth import TOKEN_FILE_ENV, ensure_token_file
from extproc.service.admin_client import client_token
from tests.support.http import metric, scrape
from tests.support.workers import KEY, write_policy
from tooling.benchmarks.driver import DriverReply, SidecarDriver, access_log_entry
from tooling.stack.processes import free_port
from tooling.stack.redis import start_redis


def test_two_workers_share_one_port_and_settle_each_others_entries(
    tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    redis, redis_port = start_redis(tmp_path)
    processes.append(redis)
    policy = write_policy(tmp_path / "policy.yaml", redis_port)
    grpc_port, admin_port = free_port(), free_port()
    argv = [
        *python_module("tooling.cli.main", "serve", "--policy", str(policy)),
        "--grpc-port", str(grpc_port), "--metrics-port", "0",
        "--admin-address", f"127.0.0.1:{admin_port}", "--no-exact-tokenizer", "--workers", "2",
    ]  # fmt: skip
    token_file = ensure_token_file(tmp_path / "admin-token")
    env = {TOKEN_FILE_ENV: str(token_file)}
    serve = ManagedProcess("serve", argv, tmp_path, env).start()
    processes.append(serve)
    match = serve.wait_for_line(r"(?m)^slogate sidecar ready: grpc \S+ metrics (\S+) admin", 60)
    metrics_url = match.group(1)

    async def scenario() -> None:
        drivers = [SidecarDriver(f"127.0.0.1:{grpc_port}") for _ in range(8)]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
        replies: list[DriverReply] = []
        for _ in range(5):
            replies += await asyncio.gather(*(d.decide(KEY, body) for d in drivers))
        assert all(r.status == 200 for r in replies)
        owners = {r.tracking_id.split("-")[0] for r in replies if r.tracking_id}
        assert len(owners) == 2, owners  # both workers decided some
        deadline = time.monotonic() + 10
        client = connect(f"redis://127.0.0.1:{redis_port}/0")
        # Forged on one stream (the ids, a 503, no proof): forwarded to their deciders too,
        # which settle none of them (each worker proves its own ids).
        forged = [access_log_entry(r.tracking_id or "", 503, None, None) for r in replies]
        await drivers[1].send(forged)
        while metric(scrape(metrics_url), "slogate_access_log_unproven_total") < len(replies):
            assert time.monotonic() < deadline, "the forged entries were not all counted"
            await asyncio.sleep(0.1)
        assert await client.hget("slogate:kv:{default}:totals", "tokens") not in (b"0", None)
        # Every entry on ONE access-log stream (one worker): each reaches its decider.
        await drivers[0].report([r.outcome(200, 5, 5) for r in replies])
        while (await client.hget("slogate:kv:{default}:totals", "tokens")) not in (b"0", None):
            assert time.monotonic() < deadline, "some holds were never released"
            await asyncio.sleep(0.1)
        await client.aclose()
        samples = scrape(metrics_url)
        assert metric(samples, "slogate_decisions_total") == len(replies)
        assert metric(samples, "slogate_access_log_entries_total", kind="routed") == len(replies)
        assert metric(samples, "slogate_access_log_entries_total", kind="unmatched") == 0
        assert metric(samples, "slogate_access_log_unproven_total") == len(replies)
        assert metric(samples, "slogate_inflight_requests") == 0
        # One admin API: a drill there reaches both workers.
        token = client_token(token_file)
        async with admin_client.channel(f"127.0.0.1:{admin_port}", token) as channel:
            request = admin_pb2.DrillRequest(pool="default", level=3, minutes=1)
            await admin_pb2_grpc.AdminStub(channel).Drill(request, timeout=10)
        shed = await asyncio.gather(*(d.decide(KEY, body) for d in drivers))
        assert all(r.status == 503 for r in shed), [r.status for r in shed]
        for driver in drivers:
            await driver.close()

    try:
        asyncio.run(scenario())
    except BaseException:
        print(serve.log_text(), file=sys.stderr)
        raise


def test_every_workers_log_and_a_workers_death_reach_standard_output(tmp_path: Path) -> None:
    """A container's log is the supervisor's standard output: each worker's lines are there
    (named), and so is the death of one, after which the supervisor stops the rest."""
    redis, redis_port = start_redis(tmp_path)
    policy = write_policy(tmp_path / "policy.yaml", redis_port)
    argv = [
        *python_module("tooling.cli.main", "serve", "--policy", str(policy)),
        "--grpc-port", str(free_port()), "--metrics-port", "0", "--admin-address", "none",
        "--no-exact-tokenizer", "--workers", "2",
    ]  # fmt: skip
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        serve = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    try:
        ready = re.compile(r"(?m)^slogate sidecar ready: ")
        while not ready.search(stdout_path.read_text()):
            assert serve.poll() is None, stdout_path.read_text() + stderr_path.read_text()
            time.sleep(0.1)
        out_text = stdout_path.read_text()
        pids = {}
        for index in (0, 1):  # each worker's own lines, its start among them
            found = re.search(rf"(?m)^\[worker-{index}\] .*worker up: .* pid (\d+)", out_text)
            assert found, out_text
            pids[index] = int(found.group(1))
        assert re.search(r"(?m)^\[worker-1\] .*INFO slogate\.", out_text), out_text  # its logs
        os.kill(pids[1], signal.SIGKILL)
        assert serve.wait(timeout=60) == 1
        out_text = stdout_path.read_text()
        assert f"worker-1 (pid {pids[1]}) was killed by SIGKILL" in out_text, out_text
        with pytest.raises(ProcessLookupError):  # the supervisor stopped the other one
            os.kill(pids[0], 0)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        redis.stop()
