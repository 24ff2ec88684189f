"""Log records as JSON lines naming their request (`slogate serve --log-format json`).

A real `slogate serve` driven over gRPC as Envoy does: every line it writes parses, and a
request's lines carry its x-request-id. (Through Envoy, with `slogate up`'s sidecars:
tests/e2e/extproc/service/test_tracing.py.) The formatter alone:
tests/extproc/service/test_log_records.py."""

from __future__ import annotations

import json
from pathlib import Path

from extproc.runtime.processes import ManagedProcess, python_module
from tests.support.http import chat_body
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import SidecarDriver


async def test_serve_with_json_logs_writes_only_json_lines_naming_requests(
    tmp_path: Path,
) -> None:
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False  # no pools run here
    policy = write_policy(tmp_path / "policy.yaml", raw)
    argv = python_module(
        "tooling.cli.main", "serve", "--policy", str(policy), "--host", "127.0.0.1",
        "--grpc-port", "0", "--metrics-port", "0", "--admin-address", "none",
        "--no-exact-tokenizer", "--log-format", "json", "--log-level", "debug",
    )  # fmt: skip
    sidecar = ManagedProcess("sidecar-json", argv, tmp_path).start()
    try:
        ready = sidecar.wait_for_line(r"sidecar ready: grpc 127\.0\.0\.1:(\d+)")
        driver = SidecarDriver(f"127.0.0.1:{ready.group(1)}")
        routed = await driver.decide("sk-demo-standard", chat_body(), headers={"x-request-id": "j"})
        refused = await driver.decide("sk-nobody", chat_body(), headers={"x-request-id": "k"})
        await driver.close()
    finally:
        sidecar.stop()  # SIGTERM: its stopping lines are checked too
    assert (routed.status, refused.status) == (200, 401)
    # stdout and stderr both land in the process's log: every line of either is JSON.
    lines = [json.loads(line) for line in sidecar.log_text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in lines)
    assert any("sidecar ready" in line["message"] for line in lines)
    about = {rid: [x for x in lines if x.get("request_id") == rid] for rid in ("j", "k")}
    assert any(x["message"].startswith("routed") for x in about["j"]), lines
    assert any("unknown_api_key" in x["message"] for x in about["k"]), lines
