"""Policy reloads in a running sidecar: on file change and on SIGHUP; bad policies refused.
In process: tests/extproc/runtime/test_policy_holder.py."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tests.support.http import metric, scrape
from tests.support.keys import KEYS_A, KEYS_B
from tooling.benchmarks.driver import SidecarDriver
from tooling.stack.processes import start_sidecar


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
