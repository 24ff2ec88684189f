"""A tenant that shares its limits: one budget for all its keys, with the real budget step,
store and quota controller; a tenant that does not keeps one budget per key."""

from __future__ import annotations

import pytest

from admission.budget_step import BudgetStep
from admission.decision import Applicant, CountKind, RoutingDecision
from admission.errors import RateLimited
from admission.events import NoEvents
from budget.key_quotas import KeyQuotas
from budget.store import InProcessStore
from policy.domain import ApiKey, ContextBucket
from policy.keyring import KeyRecord
from policy.loader import parse_policy

POLICY = parse_policy(
    {
        "tenants": {
            "defaults": {},
            "list": {
                "team": {"shared_limits": True, "limits": {"requests_per_minute": 3}},
                "solo": {"limits": {"requests_per_minute": 3}},
            },
        },
        "keys": [
            {"key": "sk-team-a", "tenant": "team"},
            {"key": "sk-team-b", "tenant": "team"},
            {"key": "sk-team-own", "tenant": "team", "limits": {"requests_per_minute": 5}},
            {"key": "sk-solo-a", "tenant": "solo"},
            {"key": "sk-solo-b", "tenant": "solo"},
        ],
    }
)


def key(clear: str) -> ApiKey:
    found = POLICY.key_for(clear)
    assert found is not None
    return found


def test_the_keys_of_a_sharing_tenant_name_one_budget() -> None:
    a, b, own = key("sk-team-a"), key("sk-team-b"), key("sk-team-own")
    assert a.budget_id == b.budget_id == "tenant:team"
    assert own.budget_id == own.key_id  # limits of its own: a budget of its own
    assert key("sk-solo-a").budget_id != key("sk-solo-b").budget_id
    # A stored key (the key store) and a JWT caller naming the tenant share it too.
    stored = KeyRecord("ab" * 32, "team").caller(POLICY.tier_limits, POLICY.tenants)
    assert stored.budget_id == "tenant:team"
    assert (
        KeyRecord("cd" * 32, "team", limits={"requests_per_minute": 9})
        .caller(POLICY.tier_limits, POLICY.tenants)
        .budget_id
        == ("cd" * 32)[:12]
    )


def _decision(caller: ApiKey, request_id: str) -> RoutingDecision:
    return RoutingDecision(
        request_id=request_id,
        caller=caller,
        pool="default",
        bucket=ContextBucket("0-4k", 0, 4096, 1.0),
        prompt_tokens=100,
        max_tokens=10,
        estimate=CountKind.EXACT,
        stream=False,
    )


async def test_a_sharing_tenant_s_keys_draw_on_one_budget() -> None:
    gate = BudgetStep(InProcessStore(), NoEvents(), ttl_s=60)
    for i in range(3):
        await gate.admit(Applicant(_decision(key("sk-team-a"), f"a{i}"), f"a{i}", POLICY))
    with pytest.raises(RateLimited) as refused:
        await gate.admit(Applicant(_decision(key("sk-team-b"), "b"), "b", POLICY))
    assert "tenant 'team'" in str(refused.value), str(refused.value)
    # The key with limits of its own still has its own room.
    await gate.admit(Applicant(_decision(key("sk-team-own"), "own"), "own", POLICY))
    # A tenant that does not share: each key its own three a minute.
    for i in range(3):
        await gate.admit(Applicant(_decision(key("sk-solo-a"), f"s{i}"), f"s{i}", POLICY))
    await gate.admit(Applicant(_decision(key("sk-solo-b"), "sb"), "sb", POLICY))


def test_the_controller_steps_a_shared_budget_once_an_interval() -> None:
    limited = parse_policy(
        {
            "tenants": {
                "list": {"team": {"shared_limits": True, "limits": {"tokens_per_minute": 60_000}}}
            },
            "keys": [{"key": f"sk-{i}", "tenant": "team"} for i in range(3)],
        }
    )
    keys = list(limited.keys.values())
    quotas = KeyQuotas(interval_s=5.0)
    for _ in range(4):
        quotas.observe("tenant:team", 1000.0)
        quotas.step(keys, memory_usage=0.2)
    demand = quotas.demand(keys[0])
    assert demand is not None and demand[0] == pytest.approx(1000.0 * 12)
    # Stepped once per interval (three keys, one budget): four intervals of history.
    budget = quotas._budgets["tenant:team"]
    assert len(budget.history) == 4, budget.history


def test_the_documented_team_class_shares_its_limits() -> None:
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[2] / "deploy" / "policy.tenants.example.yaml"
    raw = yaml.safe_load(example.read_text())
    raw["keys"] = [{"key": f"sk-umbrella-{i}", "tenant": "umbrella"} for i in range(2)]
    policy = parse_policy(raw)
    ids = {k.budget_id for k in policy.keys.values()}
    assert ids == {"tenant:umbrella"}, ids  # umbrella: team, and the team class shares
