"""A tenant's `spend:` and the `tenants.prices:` of the policy: merged like limits (own, then
class, then defaults), kinds a price list leaves out priced like their sibling, and errors
that name the tenant and the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policy._reader import PolicyError
from policy.domain import SpendUnit
from policy.loader import parse_policy
from policy.schema import Policy, UnverifiedSpend


def policy_with(tenants: Any) -> Policy:
    return parse_policy({"tenants": tenants, "keys": []})


def test_spend_merges_field_by_field_and_prices_default() -> None:
    policy = policy_with(
        {
            "prices": {
                "tokens": {"prompt": 1, "completion": 4, "cached_prompt": 0.1},
                "usd_per_million": {"prompt": 0.15, "completion": 0.6},
            },
            "classes": {"gold": {"spend": {"per_day": 1000, "per_month": 20000}}},
            "defaults": {"spend": {"per_month": 500}},
            "list": {
                "acme": {"class": "gold", "spend": {"per_day": 3000}},
                "globex": {"spend": {"unit": "usd", "per_month": 2500.5}},
                "nobudget": {"class": "gold", "spend": {}},
            },
        }
    )
    acme = policy.tenants.get("acme")
    assert acme is not None and acme.spend is not None
    assert (acme.spend.per_day, acme.spend.per_month, acme.spend.unit) == (
        3000,
        20000,
        SpendUnit.TOKENS,
    )
    globex = policy.tenants.get("globex")
    assert globex is not None and globex.spend is not None
    # globex names no class: it builds on the defaults, its own fields over theirs.
    assert (globex.spend.unit, globex.spend.per_month, globex.spend.per_day) == (
        SpendUnit.USD,
        2500.5,
        None,
    )
    unknown = policy.tenants.get("someone-else")
    assert unknown is not None and unknown.spend is not None and unknown.spend.per_month == 500
    prices = policy.tenants.prices
    assert prices.per_token(SpendUnit.TOKENS) == {
        "prompt": 1.0,
        "cached_prompt": 0.1,
        "completion": 4.0,
        "reasoning": 4.0,  # left out: priced as completion
    }
    usd = prices.per_token(SpendUnit.USD)
    assert usd["cached_prompt"] == pytest.approx(0.15e-6)
    assert usd["reasoning"] == pytest.approx(0.6e-6)


def test_an_entry_that_changes_the_unit_inherits_no_limit_in_the_other_unit() -> None:
    policy = policy_with(
        {
            "prices": {"usd_per_million": {"prompt": 1, "completion": 2}},
            "classes": {"gold": {"spend": {"per_day": 5_000_000, "per_month": 100_000_000}}},
            "list": {
                "acme": {"class": "gold", "spend": {"unit": "usd", "per_month": 2500}},
                "bigco": {"class": "gold", "spend": {"unit": "tokens", "per_day": 7}},
            },
        }
    )
    acme, bigco = policy.tenants.get("acme"), policy.tenants.get("bigco")
    assert acme is not None and acme.spend is not None
    assert (acme.spend.unit, acme.spend.per_day, acme.spend.per_month) == (
        SpendUnit.USD,
        None,  # not 5,000,000 dollars a day
        2500,
    )
    assert bigco is not None and bigco.spend is not None
    assert (bigco.spend.per_day, bigco.spend.per_month) == (7, 100_000_000)  # same unit


def test_without_spend_a_tenant_has_no_budget() -> None:
    policy = policy_with({"list": {"acme": {}}})
    acme = policy.tenants.get("acme")
    assert acme is not None and acme.spend is None
    assert policy.tenants.prices.per_token(SpendUnit.TOKENS)["completion"] == 1.0


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ({"list": {"acme": {"spend": {"per_month": 0}}}}, "tenants.list.acme.spend.per_month"),
        ({"list": {"acme": {"spend": {"per_week": 5}}}}, "tenants.list.acme.spend.per_week"),
        ({"list": {"acme": {"spend": {"unit": "eur", "per_day": 5}}}}, "spend.unit"),
        (
            {"list": {"acme": {"spend": {"unit": "usd", "per_day": 5}}}},
            "tenants.list.acme.spend.unit: usd needs tenants.prices.usd_per_million",
        ),
        ({"prices": {"tokens": {"prompt": 1}}}, "tenants.prices.tokens.completion: required"),
        (
            {"prices": {"tokens": {"prompt": 1, "completion": -1}}},
            "tenants.prices.tokens.completion: must be >= 0",
        ),
    ],
)
def test_errors_name_the_tenant_and_the_field(tenants: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace(".", r"\.")):
        policy_with(tenants)


def test_the_documented_examples_load_and_mean_what_they_say() -> None:
    from tests.policy.test_tenants import ROOT, commented_tenants
    from tests.support.docs import page_with

    heading = "### Spend budgets per tenant"  # docs/operators/tenants.md
    readme = page_with(heading)
    section = readme[readme.index(heading) :]
    block = section[section.index("```yaml") + len("```yaml") : section.index("```\n\n")]
    documented = policy_with(yaml.safe_load(block)["tenants"])
    acme, globex = documented.tenants.get("acme"), documented.tenants.get("globex")
    assert acme is not None and acme.spend is not None and acme.spend.per_day == 5_000_000
    assert globex is not None and globex.spend is not None and globex.spend.unit is SpendUnit.USD
    example = yaml.safe_load(
        commented_tenants((ROOT / "deploy" / "policy.example.yaml").read_text())
    )
    metered = policy_with(example["tenants"]).tenants.get("demo-metered")
    assert metered is not None and metered.spend is not None
    assert metered.spend.per_month == 100_000_000


def test_a_spend_check_waits_longer_than_the_budgets_and_admits_by_default() -> None:
    default = parse_policy({"keys": []}).budget
    assert (default.redis_timeout_ms, default.spend_timeout_ms) == (10, 100)
    assert default.spend_unverified is UnverifiedSpend.ADMIT
    # Unset, it never waits less than the budgets do.
    slow = parse_policy({"budget": {"redis_timeout_ms": 250}, "keys": []}).budget
    assert slow.spend_timeout_ms == 250
    strict = parse_policy(
        {"budget": {"spend_timeout_ms": 60, "spend_unverified": "refuse"}, "keys": []}
    ).budget
    assert (strict.spend_timeout_ms, strict.spend_unverified) == (60, UnverifiedSpend.REFUSE)


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"spend_timeout_ms": 5}, "budget.spend_timeout_ms: must be at least redis_timeout_ms"),
        ({"spend_timeout_ms": 0}, "budget.spend_timeout_ms: must be > 0"),
        ({"spend_unverified": "guess"}, "budget.spend_unverified: expected one of admit, refuse"),
    ],
)
def test_spend_check_settings_that_cannot_work_are_refused(
    budget: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError, match=message.replace(".", r"\.")):
        parse_policy({"budget": budget, "keys": []})
