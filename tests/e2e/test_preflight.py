"""`slogate preflight` against a live stack and real Prometheus servers: one scraping it
every second with the shipped rules (the checks pass), one every 30 s without them (they
fail, exit 1); an engine slowed in one zone (the zone check fails); the drills, with
streams running and waiting in the room through them, and the L3 they leave in
Prometheus (the monthly check passes). One stack for the module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from extproc.service.admin_auth import TOKEN_FILE_ENV
from tests.support.stack import engine_fault, example_policy, start_stack, write_policy
from tooling.preflight.probes import shipped_alert_names
from tooling.render.alert_rules import SHIPPED_RULES
from tooling.stack.local import LocalStack
from tooling.stack.prometheus_server import PrometheusServer, stack_jobs


@dataclass
class Deployment:
    stack: LocalStack
    policy: Path
    fast: PrometheusServer  # every 1 s, the shipped rules
    slow: PrometheusServer  # every 30 s, no rules


@pytest.fixture(scope="module", name="d")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("preflight")
    raw = example_policy()
    # Four batch slots on the default pool: of the drill's six streams, two wait in the
    # room, and wait long enough (30 s) to be admitted rather than timed out.
    raw["pools"]["default"]["max_num_seqs"] = 4
    raw["waiting_room"]["max_wait_s"] = {"critical": 30, "standard": 30, "sheddable": 30}
    policy = write_policy(work / "policy.yaml", raw)
    stack = start_stack(work / "stack", policy, time_scale=1.0)
    servers: list[PrometheusServer] = []
    try:
        jobs = stack_jobs([stack.metrics_port], [stack.admin_port])
        fast = PrometheusServer(work / "fast", jobs, [SHIPPED_RULES], 1.0).start()
        servers.append(fast)
        # Started now: its first scrape comes up to 30 s later, while the others run.
        slow = PrometheusServer(work / "slow", jobs, [], 30.0).start()
        servers.append(slow)
        fast.wait_for_targets()
        yield Deployment(stack, policy, fast, slow)
    finally:
        for server in servers:
            server.stop()
        stack.stop()


def preflight(d: Deployment, prometheus: str, *args: str) -> tuple[int, list[dict[str, str]]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooling.cli.main",
            "preflight",
            "--url",
            d.stack.url,
            "--prometheus",
            prometheus,
            "--admin",
            d.stack.admin_address,
            "--probes",
            "3",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # The drills change the breaker: the CLI sends the stack's admin token, found here.
        env={**os.environ, TOKEN_FILE_ENV: str(d.stack.admin_token_file)},
    )
    assert done.stdout.startswith("["), done.stderr
    return done.returncode, json.loads(done.stdout)


def verdicts(rows: list[dict[str, str]], check: str) -> dict[str, dict[str, str]]:
    return {row["subject"]: row for row in rows if row["check"] == check}


def zones_file(d: Deployment, tmp_path: Path) -> Path:
    first, second = d.stack.engine_ports["default"]
    path = tmp_path / "zones.yaml"
    path.write_text(
        yaml.safe_dump({f"127.0.0.1:{first}": "zone-a", f"127.0.0.1:{second}": "zone-b"})
    )
    return path


def test_a_prometheus_scraping_every_second_with_the_rules_passes(d: Deployment) -> None:
    code, rows = preflight(d, d.fast.url)
    interval = verdicts(rows, "scrape_interval")["prometheus"]
    assert interval["verdict"] == "pass", interval
    assert interval["measured"] == f"slogate/127.0.0.1:{d.stack.metrics_port} 1 s"
    rules = verdicts(rows, "alert_rules")["prometheus"]
    shipped = len(shipped_alert_names())
    assert (rules["verdict"], rules["measured"]) == ("pass", f"{shipped} of {shipped} loaded")
    # No zones anywhere: the zone check cannot be made; a fresh Prometheus holds minutes.
    assert {r["verdict"] for r in verdicts(rows, "zone_latency").values()} == {"cannot-check"}
    history = verdicts(rows, "last_l3")
    assert set(history) == {"default", "long", "fallback"}
    assert all(r["verdict"] == "cannot-check" for r in history.values()), history
    assert all("min of history" in r["measured"] for r in history.values()), history
    # Prometheus's default retention: the month can never be held whole.
    assert history["default"]["detail"] == "Prometheus keeps 15 d, less than 31 d"
    assert code == 0, rows  # cannot-check passes the gate ...
    strict, _ = preflight(d, d.fast.url, "--strict")
    assert strict == 1  # ... unless --strict


def test_a_prometheus_scraping_every_30_s_without_the_rules_fails(d: Deployment) -> None:
    d.slow.wait_for_targets(timeout_s=45.0)
    code, rows = preflight(d, d.slow.url)
    interval = verdicts(rows, "scrape_interval")["prometheus"]
    assert interval["verdict"] == "fail", interval
    assert interval["measured"] == f"slogate/127.0.0.1:{d.stack.metrics_port} 30 s"
    rules = verdicts(rows, "alert_rules")["prometheus"]
    assert rules["verdict"] == "fail"
    assert rules["measured"] == f"0 of {len(shipped_alert_names())} loaded"
    assert code == 1


def test_an_engine_slowed_in_one_zone_fails_the_zone_check(d: Deployment, tmp_path: Path) -> None:
    second = d.stack.engine_urls("default")[1]
    engine_fault(second, latency_ms=400)  # about three times the probe's own latency
    try:
        code, rows = preflight(d, d.fast.url, "--zones", str(zones_file(d, tmp_path)))
    finally:
        engine_fault(second)
    zones = verdicts(rows, "zone_latency")["default"]
    assert zones["verdict"] == "fail", zones
    medians = dict(re.findall(r"(zone-[ab]) ([\d.]+) ms", zones["measured"]))
    assert float(medians["zone-b"]) > float(medians["zone-a"]) + 300, zones
    assert verdicts(rows, "zone_latency")["long"]["verdict"] == "cannot-check"
    assert code == 1


def test_the_drills_hold_running_and_waiting_streams_and_each_preset_takes_effect(
    d: Deployment,
) -> None:
    code, rows = preflight(
        d,
        d.fast.url,
        "--drills",
        "--policy",
        str(d.policy),
        "--drill-streams",
        "6",
        "--drill-stream-tokens",
        "256",
    )
    held = verdicts(rows, "drill_held")["default"]
    assert held["verdict"] == "pass", held
    counts = re.search(
        r"6 of 6 streams whole; at the drill (\d+) running, (\d+) waiting", held["measured"]
    )
    assert counts is not None, held
    # As many run as the standard tier's share of the pool's 4 slots, the rest wait.
    running, waiting = int(counts[1]), int(counts[2])
    assert running >= 1 and waiting >= 1 and running + waiting == 6, held
    for level in (1, 2, 3):
        result = verdicts(rows, f"preset_L{level}")["default"]
        assert result["verdict"] == "pass", result
    assert "critical/short 200 via fallback" in verdicts(rows, "preset_L3")["default"]["measured"]
    assert verdicts(rows, "drill_recovery")["default"]["verdict"] == "pass"
    assert code == 0, rows
    # The L3 was held past a scrape: Prometheus has it, and the monthly check passes now.
    _, after = preflight(d, d.fast.url)
    assert verdicts(after, "last_l3")["default"]["verdict"] == "pass"
    assert verdicts(after, "last_l3")["long"]["verdict"] == "cannot-check"
