"""Policy reloads in process: good policies swapped in, bad ones and start-only changes refused.

In a running sidecar, on file change and on SIGHUP:
tests/e2e/extproc/runtime/test_policy_holder.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.metrics import SidecarMetrics
from tests.support.keys import KEYS_A, KEYS_B


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
