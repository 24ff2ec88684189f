"""KV admission through the real stack: the gate refuses past the pool's KV, and the sidecar
learns the engine's real footprint. The pure ledger: tests/admission/kv/test_capacity.py."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import (
    example_policy,
    settled,
    start_stack,
    wait_for,
    write_policy,
)


def _policy_with_kv(tmp: Path) -> Path:
    raw = example_policy()
    raw["pools"]["default"]["kv_capacity_tokens"] = 10_000
    raw.setdefault("breaker", {})["kv_shares"] = {"standard": 0.6, "sheddable": 0.3}
    path = tmp / "policy-kv.yaml"
    write_policy(path, raw)
    return path


def test_kv_admission_through_the_stack(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, policy=_policy_with_kv(tmp_path))
    try:
        # ~4000 tokens of context: more than sheddable's 3000, within critical's 10000.
        body = chat_body("tell me a story", max_tokens=4000)
        refused = post(stack.url, CHAT, body, key="sk-demo-batch")
        assert refused.status == 503, refused.body
        assert refused.headers["x-slogate-reason"] == "kv_cache_full"
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        admitted = post(stack.url, CHAT, body, key="sk-demo-critical")
        assert admitted.status == 200, admitted.body
        # Refused by its budget after KV admission: the footprint must not stay held.
        statuses = [
            post(stack.url, CHAT, chat_body("hi", max_tokens=4), key="sk-demo-small").status
            for _ in range(7)
        ]
        assert 429 in statuses and 200 in statuses
        metrics = settled(stack)
        assert metric(metrics, "slogate_kv_in_flight_tokens", pool="default") == 0
        rejected = metric(
            scrape(stack.metrics_url), "slogate_rejections_total", reason="kv_cache_full"
        )
        assert rejected == 1

        # The controller's queue signal comes from the pools' vLLM metrics (scraped).
        def queue_seen() -> bool:
            wanted = {("pool", "default"), ("signal", "queue_ratio")}
            values = [
                value
                for (name, labels), value in scrape(stack.metrics_url).items()
                if name == "slogate_breaker_signal" and wanted <= set(labels)
            ]
            return values == [0.0]  # NaN until the first scrape; NaN != 0

        assert wait_for(queue_seen, timeout_s=15.0)

        # The admin API shows what admission holds, against this sidecar's capacity.
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "tooling.cli.main",
                "status",
                "--json",
                "--admin",
                stack.admin_address,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        held = next(a for a in json.loads(status.stdout)["admission"] if a["pool"] == "default")
        assert held["pool"] == "default" and held["kvTokensCapacity"] == 10_000
        assert held.get("kvTokensHeld", "0") == "0" and held["requestsCapacity"] == 256
    finally:
        stack.stop()


def test_the_sidecar_learns_the_engines_real_footprint(tmp_path: Path) -> None:
    """Streams that ask for 2000 tokens: the sidecar counts prompt + max_tokens, the pool's
    engine reports its own KV usage, and the learned ratio falls below the upper bound."""
    raw = example_policy()
    raw["pools"]["default"]["kv_capacity_tokens"] = 50_000
    breaker = raw.setdefault("breaker", {})
    breaker.update({"controller_interval_s": 1, "scrape_interval_s": 1})
    path = tmp_path / "policy-ratio.yaml"
    write_policy(path, raw)
    stack = start_stack(tmp_path, policy=path, time_scale=0.2)  # ~8 s per stream
    try:
        body = chat_body("go on", max_tokens=2000, stream=True, ignore_eos=True)
        with ThreadPoolExecutor(4) as pool:
            streams = [
                pool.submit(post, stack.url, CHAT, body, key="sk-demo-critical") for _ in range(4)
            ]

            def learned() -> bool:
                samples = scrape(stack.metrics_url)
                ratio = [
                    value
                    for (name, labels), value in samples.items()
                    if name == "slogate_kv_footprint_ratio" and ("pool", "default") in labels
                ]
                return bool(ratio) and ratio[0] < 0.95

            assert wait_for(learned, timeout_s=8.0)
            assert all(s.result().status == 200 for s in streams)
    finally:
        stack.stop()
