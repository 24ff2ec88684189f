"""`slogate up --regions 2`: a global ledger and two regions on 127.0.0.1, each answering
the global tenant's request from its own pools."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from policy.domain import BudgetScope
from policy.loader import load_policy
from tests.support.http import CHAT, chat_body, post
from tests.support.stack import ROOT, example_policy, write_policy
from tooling.stack.regions import GLOBAL_KEY, GLOBAL_TENANT, single_pool


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float = 90.0) -> str:
    """Its output up to the `try:` line that ends the ready block."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "try: curl" in line:
            return "".join(seen)
    raise AssertionError("slogate up --regions 2 did not get ready:\n" + "".join(seen))


def test_up_with_two_regions_answers_in_each(tmp_path: Path) -> None:
    zero = ["--listen-port", "0", "--admin-port", "0", "--grpc-port", "0"]
    zero += ["--metrics-port", "0", "--admin-api-port", "0"]
    env = {**os.environ, "SLOGATE_ADMIN_TOKEN_FILE": str(tmp_path / "admin-token")}
    env["PYTHONPATH"] = str(ROOT)
    # One engine a region (the example's three pools would start five processes more).
    policy = write_policy(tmp_path / "policy.yaml", single_pool(example_policy()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tooling.cli.main", "up", "--regions", "2",
         "--policy", str(policy), "--time-scale", "0.05", *zero],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        ready = _wait_ready(proc)
        urls = dict(re.findall(r"region (\w+): (http://\S+)", ready))
        assert sorted(urls) == ["eu", "us"], ready
        assert "global ledger: redis://127.0.0.1:" in ready
        for region, url in urls.items():
            # A global tenant's first request in a region is refused (429, Retry-After) until
            # the region's next report gets it a share: a client retries, so does this test.
            replies = [post(url, CHAT, chat_body(), key=GLOBAL_KEY)]
            while replies[-1].status == 429 and len(replies) < 20:
                time.sleep(0.5)
                replies.append(post(url, CHAT, chat_body(), key=GLOBAL_KEY))
            reply = replies[-1]
            assert reply.status == 200, (region, reply.body)
            assert reply.headers["x-sim-pool"] == f"{region}-default"
            saw = json.loads(reply.headers["x-sim-saw-headers"])
            assert saw["x-slogate-tenant"] == GLOBAL_TENANT
        # Each region's policy names it, lists both with their Envoys, and the tenant is global.
        logs = re.search(r"logs (\S+)\)", ready)
        assert logs is not None, ready
        policies = sorted(Path(logs.group(1)).glob("*/policy.regions.yaml"))
        assert len(policies) == 2
        eu = load_policy(policies[0]).regions
        assert eu.this == "eu" and sorted(eu.regions) == ["eu", "us"]
        assert eu.regions["us"].ingress == urls["us"].removeprefix("http://")
        assert load_policy(policies[0]).tenants.listed[GLOBAL_TENANT].scope is BudgetScope.GLOBAL
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert "slogate up: stopped" in out, out
