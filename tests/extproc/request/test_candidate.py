"""A candidate policy judged beside the enforced one (shadow mode), and `policy diff`'s words."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from admission.assembly import build_admission
from admission.errors import RateLimited
from admission.events import NoEvents
from budget.store import InProcessStore
from extproc.request.candidate import CandidateJudge, Verdict, verdict_of
from extproc.request.flow import Decider
from extproc.request.identity import ApiKeyResolver
from extproc.request.tokens.prompt import PromptCounter
from extproc.runtime.candidate_holder import CandidateHolder
from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.candidate_metrics import CandidateMetrics
from extproc.service.metrics import SidecarMetrics
from policy._reader import PolicyError
from policy.candidate import load_candidate
from policy.diff import policy_changes
from policy.loader import load_policy, parse_policy
from policy.schema import Policy
from tooling.cli.policy import promote

RAW: dict[str, Any] = {
    "tenants": {
        "list": {
            "team-a": {"limits": {"requests_per_minute": 4}},
            "team-b": {"limits": {"requests_per_minute": 4}},
        }
    },
    "keys": [{"key": "sk-a", "tenant": "team-a"}, {"key": "sk-b", "tenant": "team-b"}],
}


def halved(raw: dict[str, Any]) -> dict[str, Any]:
    """The same policy with team-a's requests per minute halved."""
    copy = json.loads(json.dumps(raw))
    copy["tenants"]["list"]["team-a"]["limits"]["requests_per_minute"] = 2
    return copy


def test_verdicts_compare_each_sides_pool() -> None:
    assert verdict_of("default", "default") is Verdict.SAME
    assert verdict_of("default", None) is Verdict.WOULD_REFUSE
    assert verdict_of(None, "default") is Verdict.WOULD_ADMIT
    assert verdict_of("default", "long") is Verdict.WOULD_ROUTE
    assert verdict_of(None, None) is Verdict.SAME


def test_diff_names_what_changed_in_words() -> None:
    old = parse_policy(RAW)
    new_raw = halved(RAW)
    new_raw["tenants"]["list"]["team-b"]["suspended"] = True
    new_raw["tenants"]["list"]["team-c"] = {"tier": "critical"}
    new_raw["keys"].append({"key": "sk-c", "tenant": "team-c"})
    new_raw["model"] = {"default_max_tokens": 2048}
    said = policy_changes(old, parse_policy(new_raw))
    text = "\n".join(said)
    assert "Tenant `team-c` added." in said
    assert "Tenant `team-a`: requests_per_minute 4 → 2." in said
    assert "Tenant `team-b`: suspended." in said
    assert "Tenant `team-c`: 1 key (" in text and "added." in text
    # team-a's key inherits its tenant's new limit: keys are grouped by tenant and change
    assert "Tenant `team-a`: 1 key (`" in text and "`): requests_per_minute 4 → 2." in text
    assert "`default_max_tokens` 1024 → 2048." in said
    assert policy_changes(old, parse_policy(RAW)) == []


def shadowed(
    policy: Policy, candidate: Policy
) -> tuple[Decider, CandidateJudge, CollectorRegistry]:
    """The real decider and admission chain (budgets in process) with `candidate` beside."""
    now = [1000.0]
    admission = build_admission(
        board=None,
        store=InProcessStore(lambda: now[0]),
        events=NoEvents(),
        clock=lambda: now[0],
        ttl_s=60.0,
        policy=lambda: policy,
    )
    registry = CollectorRegistry()
    metrics = CandidateMetrics(registry)
    judge = CandidateJudge(lambda: candidate, metrics, 60.0, clock=lambda: now[0])
    counter = PromptCounter(None, policy.counting, ThreadPoolExecutor(1))
    decider = Decider(
        policy=lambda: policy,
        identity=ApiKeyResolver(),
        counter=counter,
        admission=admission.chain,
        candidate=judge,
    )
    return decider, judge, registry


BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()


def headers(key: str) -> dict[str, str]:
    return {":path": "/v1/chat/completions", "authorization": f"Bearer {key}"}


async def test_a_candidate_halving_one_tenant_counts_would_refuse_for_it_only() -> None:
    """Item 7: in shadow, the candidate counts would-refuse for that tenant only and
    refuses nothing."""
    decider, judge, registry = shadowed(parse_policy(RAW), parse_policy(halved(RAW)))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    notes = []
    for key in ("sk-a", "sk-b") * 4:
        flow = decider.new_flow()
        headers = {":path": "/v1/chat/completions", "authorization": f"Bearer {key}"}
        await flow.on_request_headers(headers, end_of_stream=False)
        routed = await flow.on_request_body(body.encode())  # nothing refused
        notes.append((key, routed.decision.candidate))
    await judge.drain()

    def count(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert count("slogate_candidate_would_refuse_total", tenant="team-a", reason="budget_requests")
    assert count("slogate_candidate_decisions_total", tenant="team-a", verdict="would_refuse") == 2
    assert count("slogate_candidate_decisions_total", tenant="team-a", verdict="same") == 2
    assert count("slogate_candidate_decisions_total", tenant="team-b", verdict="same") == 4
    assert count("slogate_candidate_decisions_total", tenant="team-b", verdict="would_refuse") == 0
    verdicts = [(key, note.verdict) for key, note in notes if note is not None]
    assert verdicts.count(("sk-a", "would_refuse")) == 2 and len(verdicts) == 8


def write(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_a_candidate_is_a_whole_policy_checked_like_one(tmp_path: Path) -> None:
    raw = {**RAW, "candidate": {"file": "candidate.yaml"}}
    policy_path = write(tmp_path / "policy.yaml", raw)
    write(tmp_path / "candidate.yaml", {**RAW, "tenants": {"lst": {}}})
    with pytest.raises(PolicyError, match=r"candidate .*candidate\.yaml: tenants\.lst"):
        load_candidate(load_policy(policy_path))
    write(tmp_path / "candidate.yaml", {**RAW, "request": {"max_body_bytes": 5}})
    with pytest.raises(PolicyError, match="max_body_bytes: differ from the policy"):
        load_candidate(load_policy(policy_path))
    write(tmp_path / "candidate.yaml", raw)
    with pytest.raises(PolicyError, match="names no candidate"):
        load_candidate(load_policy(policy_path))


async def test_a_bad_candidate_is_refused_alone_and_promote_goes_through_reload(
    tmp_path: Path,
) -> None:
    policy_path = write(tmp_path / "policy.yaml", {**RAW, "candidate": {"file": "cand.yaml"}})
    write(tmp_path / "cand.yaml", {**RAW, "keys": "not a list"})
    metrics = SidecarMetrics()
    holder = PolicyHolder(policy_path, metrics)
    candidate = CandidateHolder(holder, CandidateMetrics(metrics.registry))
    assert candidate() is None and candidate.error is not None and "keys" in candidate.error
    assert holder().candidate is not None  # the enforced policy applies regardless

    write(tmp_path / "cand.yaml", halved(RAW))
    assert await holder.reload_error() is None and holder.notice is None
    active = candidate()
    assert active is not None and candidate.error is None

    # Broken again: the reload applies the policy and says why the candidate was refused
    # (`slogate reload` prints it); the candidate judged until now stays.
    write(tmp_path / "cand.yaml", {**RAW, "tenants": {"list": {"team-a": {"tier": "gold"}}}})
    assert await holder.reload_error() is None
    assert holder.notice is not None and "candidate was refused" in holder.notice
    assert "tier" in holder.notice and candidate() is active
    write(tmp_path / "cand.yaml", halved(RAW))
    assert await holder.reload_error() is None and candidate.error is None

    promote(policy_path)  # the candidate becomes the policy; the old one is kept aside
    assert (tmp_path / "policy.yaml.previous").exists()
    assert await holder.reload_error() is None
    promoted: Policy = holder()
    assert promoted.candidate is None and candidate() is None
    team_a = promoted.tenants.get("team-a")
    assert team_a is not None and team_a.limits == {"requests_per_minute": 2}


def test_policy_diff_prints_markdown_and_refuses_a_missing_traffic_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tooling.cli.main import main

    old, new = write(tmp_path / "old.yaml", RAW), write(tmp_path / "new.yaml", halved(RAW))
    assert main(["policy", "diff", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Policy changes") and "- Tenant `team-a`: requests_per_minute" in out
    assert main(["policy", "diff", str(old), str(new), "--traffic", str(tmp_path)]) == 2
    assert "no traffic record files found" in capsys.readouterr().err  # the diff: its own test
    assert main(["policy", "promote", "--policy", str(old)]) == 2  # it names no candidate


async def test_what_the_policy_refuses_and_the_candidate_admits_is_noted_before_the_refusal() -> (
    None
):
    decider, _, registry = shadowed(parse_policy(halved(RAW)), parse_policy(RAW))
    verdicts = []
    for _ in range(4):
        flow = decider.new_flow()
        await flow.on_request_headers(headers("sk-a"), end_of_stream=False)
        with contextlib.suppress(RateLimited):
            await flow.on_request_body(BODY)
        shape = flow.shape  # what the traffic record writes a refusal from, at once
        assert shape is not None and shape.candidate is not None
        verdicts.append(shape.candidate.verdict)
    # The two admitted are judged in a task, after their answer; the two refused before.
    assert verdicts[2:] == ["would_admit", "would_admit"]
    labels = {"tenant": "team-a", "verdict": "would_admit"}
    assert registry.get_sample_value("slogate_candidate_decisions_total", labels) == 2


async def test_in_a_shared_store_the_candidates_windows_stand_apart_from_the_real_ones() -> None:
    """A fleet on Redis: the candidate's windows are `candidate:`-prefixed ids in the same
    store (here an in-process one), the real windows untouched; refusals judged in a task."""
    from budget.prefixed_store import PrefixedStore
    from extproc.request.candidate import CANDIDATE_BUDGETS

    policy, candidate = parse_policy(halved(RAW)), parse_policy(RAW)
    shared = InProcessStore(lambda: 1000.0)
    admission = build_admission(
        board=None,
        store=shared,
        events=NoEvents(),
        clock=lambda: 1000.0,
        ttl_s=60.0,
        policy=lambda: policy,
    )
    registry = CollectorRegistry()
    judge = CandidateJudge(
        lambda: candidate,
        CandidateMetrics(registry),
        60.0,
        store=PrefixedStore(shared, CANDIDATE_BUDGETS),
    )
    decider = Decider(
        policy=lambda: policy,
        identity=ApiKeyResolver(),
        counter=PromptCounter(None, policy.counting, ThreadPoolExecutor(1)),
        admission=admission.chain,
        candidate=judge,
    )
    for _ in range(3):
        flow = decider.new_flow()
        await flow.on_request_headers(headers("sk-a"), end_of_stream=False)
        with contextlib.suppress(RateLimited):
            await flow.on_request_body(BODY)
    await judge.drain()
    key_id = parse_policy(RAW).keys[next(iter(parse_policy(RAW).keys))].key_id
    # The real window: the 2 admitted, in flight. The candidate's: the same 2 in flight,
    # and the third (refused for real) settled there at once with what it reserved.
    assert await shared.outstanding(key_id) == 2 and (await shared.usage(key_id))[60] == 0
    assert await shared.outstanding(CANDIDATE_BUDGETS + key_id) == 2
    assert (await shared.usage(CANDIDATE_BUDGETS + key_id))[60] > 0
    labels = {"tenant": "team-a", "verdict": "would_admit"}
    assert registry.get_sample_value("slogate_candidate_decisions_total", labels) == 1


def test_diff_names_objectives_pools_spend_and_routing() -> None:
    from tests.support.stack import example_policy

    old = example_policy()
    old["tenants"] = {"defaults": {}, "list": {"demo-batch": {}}}
    new = json.loads(json.dumps(old))
    new["slos"]["critical"]["default"] = 900
    new["pools"]["long"]["max_num_seqs"] = 8
    new["routing"] = {"rules": [{"pool": "long", "min_context_tokens": 16385}]}
    new["tenants"]["list"]["demo-batch"] = {"pools": ["default"], "spend": {"per_day": 1000}}
    engine = old["pools"]["default"]["endpoints"][0]
    new["pools"]["default"]["zones"] = {engine: "zone-a"}
    said = policy_changes(parse_policy(old), parse_policy(new))
    assert f"Pool `default`: zones none → {{{engine}: zone-a}}." in said, said
    assert "`slo_ttft_p99_ms[critical/default]` 2000 → 900." in said
    assert "Pool `long`: max_num_seqs 256 → 8." in said
    assert "Routing rules: [32769+ tokens to `long`] → [16385+ tokens to `long`]." in said
    assert (
        "Tenant `demo-batch`: pools all → {default}; spend budget unset → per day 1000, "
        "per month unset (tokens)." in said
    )
