"""Shadow mode through the real stack (Envoy, the sidecar, simulated pools): a candidate
halving one tenant's requests per minute counts would-refuse for that tenant only and
refuses nothing (issue 29, item 7)."""

from __future__ import annotations

import copy
from pathlib import Path

from tests.support.http import CHAT, chat_body, metric, post, scrape
from tests.support.stack import example_policy, start_stack, wait_for, write_policy


def test_a_candidate_counts_would_refuse_for_one_tenant_and_refuses_nothing(
    tmp_path: Path,
) -> None:
    raw = example_policy()
    raw["tenants"] = {
        "defaults": {},
        "list": {"demo-standard": {"limits": {"requests_per_minute": 4}}},
    }
    candidate = copy.deepcopy(raw)
    candidate["tenants"]["list"]["demo-standard"]["limits"]["requests_per_minute"] = 2
    candidate_path = write_policy(tmp_path / "candidate.yaml", candidate)
    raw["candidate"] = {"file": str(candidate_path)}
    stack = start_stack(tmp_path, write_policy(tmp_path / "policy.yaml", raw))
    try:
        for key in ("sk-demo-standard", "sk-demo-critical") * 4:
            reply = post(stack.url, CHAT, chat_body("hi"), key=key)
            assert reply.status == 200, reply.body  # the candidate refuses nothing

        def judged() -> bool:
            samples = scrape(stack.metrics_url)
            return metric(samples, "slogate_candidate_decisions_total") == 8

        assert wait_for(judged)
        samples = scrape(stack.metrics_url)
        assert metric(samples, "slogate_candidate_active") == 1
        refused = "slogate_candidate_would_refuse_total"
        assert metric(samples, refused, tenant="demo-standard", reason="budget_requests") == 2
        assert metric(samples, refused) == 2  # that tenant only
        decisions = "slogate_candidate_decisions_total"
        assert metric(samples, decisions, tenant="demo-critical", verdict="same") == 4
        assert metric(samples, "slogate_rejections_total") == 0
    finally:
        stack.stop()
