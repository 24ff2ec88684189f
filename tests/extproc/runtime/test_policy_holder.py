"""Policy reloads in a running sidecar: on file change and on SIGHUP; bad policies refused."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.metrics import SidecarMetrics
from tests.support.http import metric, scrape
from tooling.benchmarks.driver import SidecarDriver
from tooling.stack.processes import start_sidecar

KEYS_A = "keys:\n  - {key: sk-a, tenant: a}\n"
KEYS_B = "keys:\n  - {key: sk-b, tenant: b}\n"


def test_holder_swaps_good_policies_and_keeps_the_old_one_on_errors(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(KEYS_A)
    metrics = SidecarMetrics()
    holder = PolicyHolder(path, metrics)
    first = holder()
    assert first.key_for("sk-a") is not None
    path.write_text("keys: [{key: sk-x, tenant: x, tier: platinum}]\n")
    assert not asyncio.run(holder.reload())
    assert holder() is first  # the bad policy was refused; the old one is still active
    path.write_text(KEYS_B)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert asyncio.run(holder.reload_if_changed())
    assert holder().key_for("sk-b") is not None and holder().key_for("sk-a") is None
    assert not asyncio.run(holder.reload_if_changed())  # unchanged file: nothing to do
    value = metrics.registry.get_sample_value
    assert value("slogate_policy_reloads_total", {"result": "rejected"}) == 1
    assert value("slogate_policy_reloads_total", {"result": "ok"}) == 1


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("breaker: {window_s: 30}\n", "breaker.window_s"),
        ("budget: {store: redis}\n", "budget"),
        ("request: {max_body_bytes: 1024}\n", "max_body_bytes"),
        ("counting: {workers: 4}\n", "counting"),
    ],
)
def test_a_reload_that_changes_a_start_only_setting_is_refused_whole(
    tmp_path: Path, change: str, named: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(KEYS_A)
    holder = PolicyHolder(path, SidecarMetrics())
    first = holder()
    # The keys change too, and still do not apply: half a policy is never active.
    path.write_text(KEYS_B + change)
    reason = asyncio.run(holder.reload_error())
    assert reason is not None and reason.startswith(named + ":"), reason
    assert "restart" in reason
    assert holder() is first and holder().key_for("sk-b") is None
    # The same keys without the start-only change load.
    path.write_text(KEYS_B)
    assert asyncio.run(holder.reload_error()) is None and holder().key_for("sk-b") is not None


@pytest.mark.e2e
def test_running_sidecar_reloads_on_sighup_and_file_change(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(KEYS_A)
    proc, ports = start_sidecar(tmp_path, path)
    try:
        grpc_port, metrics_port = ports.grpc, ports.metrics
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

        async def status(key: str) -> int:
            driver = SidecarDriver(f"127.0.0.1:{grpc_port}")
            try:
                return (await driver.decide(key, body)).status
            finally:
                await driver.close()

        assert asyncio.run(status("sk-a")) == 200
        assert asyncio.run(status("sk-b")) == 401
        path.write_text(KEYS_B)  # picked up by the file watcher within a second or two
        deadline = time.monotonic() + 10
        while asyncio.run(status("sk-b")) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert asyncio.run(status("sk-b")) == 200
        assert asyncio.run(status("sk-a")) == 401

        path.write_text("keys: [{key: sk-c, tenant: c, colour: red}]\n")
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if metric(scrape(metrics_url), "slogate_policy_reloads_total", result="rejected"):
                break
            time.sleep(0.1)
        assert "keys[0].colour: unknown field" in proc.log_text()
        assert asyncio.run(status("sk-b")) == 200  # still the last good policy
        assert proc.running()
    finally:
        proc.stop()
