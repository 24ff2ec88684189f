"""One rule makes a caller (policy.domain.build_caller): a key the policy lists, a stored key
(policy.keyring) and a JWT's claims (extproc.request.identity) naming the same tenant and
tier get the same tier, limits and budget, including a tier the policy sets no limits for."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.request.identity import caller_from_claims
from policy._access import parse_keys
from policy.domain import ApiKey, Limits, Tier, hash_api_key
from policy.keyring import KeyRecord
from policy.loader import parse_policy

JWT = {"issuer": "https://auth.example.com/", "jwks_file": "/dev/null"}
RAW: dict[str, Any] = {
    # Only standard has limits of its own: critical and sheddable have none.
    "tiers": {"standard": {"requests_per_minute": 300, "tokens_per_minute": 1000}},
    "tenants": {
        "defaults": {},
        "list": {
            "team": {"shared_limits": True, "limits": {"requests_per_minute": 3}},
            "urgent": {"tier": "critical", "limits": {"tokens_per_minute": 50}},
        },
    },
}
POLICY = parse_policy({**RAW, "jwt": JWT})

# (tenant, tier named by the key or the token, or None: its tenant's)
CASES = [
    ("plain", None),
    ("plain", "sheddable"),  # a tier with no limits of its own
    ("team", None),  # a tenant sharing one budget
    ("team", "critical"),
    ("urgent", None),  # the tenant's tier, with no limits of its own
    ("urgent", "standard"),
]


def _policy_key(tenant: str, tier: str | None, limits: dict[str, int]) -> ApiKey:
    entry: dict[str, Any] = {"key": "sk-same", "tenant": tenant}
    if tier is not None:
        entry["tier"] = tier
    if limits:
        entry["limits"] = limits
    policy = parse_policy({**RAW, "keys": [entry]})
    found = policy.key_for("sk-same")
    assert found is not None
    return found


def _stored(tenant: str, tier: str | None, limits: dict[str, int]) -> ApiKey:
    record = KeyRecord(hash_api_key("sk-same"), tenant, Tier(tier) if tier else None, limits)
    return record.caller(POLICY.tier_limits, POLICY.tenants)


def _jwt(tenant: str, tier: str | None) -> ApiKey:
    claims = {"tenant": tenant, "sub": "u1", **({"tier": tier} if tier else {})}
    return caller_from_claims(POLICY, claims)


def _made(caller: ApiKey) -> tuple[str, Tier, Limits, bool]:
    return caller.tenant, caller.tier, caller.limits, caller.shared_budget


@pytest.mark.parametrize(("tenant", "tier"), CASES)
def test_a_policy_key_a_stored_key_and_a_token_make_the_same_caller(
    tenant: str, tier: str | None
) -> None:
    by_policy = _policy_key(tenant, tier, {})
    assert _made(by_policy) == _made(_stored(tenant, tier, {})) == _made(_jwt(tenant, tier))
    assert by_policy.key_sha256 == _stored(tenant, tier, {}).key_sha256


@pytest.mark.parametrize(("tenant", "tier"), CASES)
def test_a_key_with_limits_of_its_own_is_made_the_same_stored_or_listed(
    tenant: str, tier: str | None
) -> None:
    own = {"concurrent_requests": 2}
    by_policy = _policy_key(tenant, tier, own)
    assert _made(by_policy) == _made(_stored(tenant, tier, own))
    assert by_policy.limits.concurrent_requests == 2 and not by_policy.shared_budget


def test_a_tier_with_no_limits_of_its_own_is_unlimited_but_for_its_tenant() -> None:
    assert _jwt("plain", "sheddable").limits == Limits()
    assert _jwt("urgent", None).limits == Limits(tokens_per_minute=50)
    assert _jwt("team", None).shared_budget
    assert _jwt("team", None).limits == Limits(
        requests_per_minute=3, tokens_per_minute=1000
    )  # the tenant's over standard's
    # A mapping that lacks the tier altogether (a Policy built in code) reads the same as
    # a `tiers:` section that leaves it out, for every path, instead of a KeyError.
    assert KeyRecord("ab" * 32, "plain", Tier.SHEDDABLE).caller({}).limits == Limits()
    keys = parse_keys([{"key": "sk-x", "tenant": "plain", "tier": "critical"}], "keys", {})
    assert keys[hash_api_key("sk-x")].limits == Limits()


def test_limits_that_set_nothing_are_not_limits_of_its_own() -> None:
    # `limits: {}` sets no field, so the key still draws on its tenant's one budget, as a
    # stored key with no overrides does.
    policy = parse_policy({**RAW, "keys": [{"key": "sk-e", "tenant": "team", "limits": {}}]})
    found = policy.key_for("sk-e")
    assert found is not None and found.shared_budget
    assert found.budget_id == _stored("team", None, {}).budget_id == "tenant:team"


def test_a_budget_bucket_draws_against_its_own_limit() -> None:
    limits = Limits(requests_per_minute=1, tokens_per_minute=2, tokens_per_hour=3)
    assert [limits.capacity(b) for b in ("requests", "tokens", "hour")] == [1, 2, 3]
    assert Limits().capacity("tokens") is None  # unlimited
    with pytest.raises(KeyError):
        limits.capacity("concurrent_requests")  # not a bucket of the ledger
