"""The policy's `regions:` section and a tenant's budget `scope`: absent means one region;
every field's error names its path; a global tenant needs the section."""

from __future__ import annotations

from typing import Any

import pytest

from policy._reader import PolicyError
from policy._regions import Fallback
from policy.domain import BudgetScope, Tier
from policy.loader import parse_policy
from policy.schema import Policy

LEDGER = {"url": "redis://127.0.0.1:6390/0"}


def policy_with(regions: Any, tenants: Any = None) -> Policy:
    raw: dict[str, Any] = {"keys": [], "regions": regions}
    if tenants is not None:
        raw["tenants"] = tenants
    return parse_policy(raw)


def test_without_the_section_the_fleet_is_one_region() -> None:
    policy = parse_policy({"keys": []})
    assert not policy.regions.enabled
    assert policy.regions.peers() == ()


def test_a_full_section_reads_every_field() -> None:
    policy = policy_with(
        {
            "this": "eu",
            "list": {"eu": {"ingress": "10.0.1.10:10000"}, "us-east": {"ingress": "h:1"}},
            "ledger": {
                **LEDGER,
                "report_interval_s": 0.5,
                "lease_s": 4,
                "fallback_share": 0.25,
                "limits_fallback": "closed",
                "spend_fallback": "share",
            },
            "crossing": {
                "enabled": True,
                "tiers": ["sheddable", "standard"],
                "tenants": ["batch-co"],
                "secret_file": "/etc/slogate/regions.key",
                "max_added_ms": 300,
            },
        },
        {"defaults": {"scope": "global"}, "list": {"local-co": {"scope": "region"}}},
    )
    regions = policy.regions
    assert regions.enabled and regions.this == "eu"
    assert [p.name for p in regions.peers()] == ["us-east"]
    assert regions.ledger.lease_s == 4.0 and regions.ledger.fallback_share == 0.25
    assert regions.ledger.limits_fallback == Fallback.CLOSED
    assert regions.ledger.spend_fallback == Fallback.SHARE
    assert regions.crossing.tiers == {Tier.SHEDDABLE, Tier.STANDARD}
    assert regions.crossing.tenants == {"batch-co"} and regions.crossing.max_added_ms == 300
    local, other = policy.tenants.get("local-co"), policy.tenants.get("anyone")
    assert local is not None and local.scope is BudgetScope.REGION
    assert other is not None and other.scope is BudgetScope.GLOBAL


def test_defaults_a_fallback_share_of_last_and_closed_spend() -> None:
    ledger = policy_with({"this": "eu", "list": {"eu": {}}, "ledger": LEDGER}).regions.ledger
    assert ledger.fallback_share is None  # the share last held
    assert ledger.limits_fallback == Fallback.SHARE
    assert ledger.spend_fallback == Fallback.CLOSED
    explicit = {**LEDGER, "fallback_share": "last"}
    assert policy_with({"this": "eu", "list": {"eu": {}}, "ledger": explicit}).regions.ledger == (
        ledger
    )


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        ({"this": "EU", "list": {"EU": {}}}, "regions.this: 'EU' is not a region name"),
        ({"this": "eu", "list": {"us": {}}, "ledger": LEDGER}, "regions.this: 'eu' is not in"),
        ({"this": "eu", "list": {"eu": {}}}, "regions.ledger.url: required field is missing"),
        ({"list": {"eu": {}}, "ledger": LEDGER}, "regions.this: required field is missing"),
        (
            {"this": "eu", "list": {"eu": {"ingress": "nope"}}, "ledger": LEDGER},
            "regions.list.eu.ingress: expected host:port",
        ),
        (
            {"this": "eu", "list": {"eu": {"zone": "a"}}, "ledger": LEDGER},
            "regions.list.eu.zone: unknown field",
        ),
        (
            {"this": "eu", "list": {"eu": {}}, "ledger": {**LEDGER, "lease_s": 1}},
            "regions.ledger.lease_s: 1.0 s must be at least twice report_interval_s",
        ),
        (
            {"this": "eu", "list": {"eu": {}}, "ledger": {**LEDGER, "fallback_share": 2}},
            "regions.ledger.fallback_share: must be 'last' or within [0, 1]",
        ),
        (
            {"this": "eu", "list": {"eu": {}}, "ledger": {**LEDGER, "spend_fallback": "open"}},
            "regions.ledger.spend_fallback: expected one of share, closed",
        ),
        (
            {"this": "eu", "list": {"eu": {}}, "ledger": LEDGER, "crossing": {"enabled": True}},
            "regions.crossing.secret_file: crossing needs the regions' shared secret",
        ),
        (
            {
                "this": "eu",
                "list": {"eu": {}},
                "ledger": LEDGER,
                "crossing": {"enabled": True, "secret_file": "/k"},
            },
            "regions.crossing.enabled: no region in regions.list has an ingress",
        ),
        (
            {
                "this": "eu",
                "list": {"eu": {}},
                "ledger": LEDGER,
                "crossing": {"tiers": ["gold"]},
            },
            "regions.crossing.tiers: 'gold' is not a tier",
        ),
    ],
)
def test_each_error_names_its_field(regions: Any, message: str) -> None:
    with pytest.raises(PolicyError) as error:
        policy_with(regions)
    assert str(error.value).startswith(message), error.value


def test_a_global_tenant_needs_the_regions_section() -> None:
    with pytest.raises(PolicyError, match=r"^tenants\.list\.acme\.scope: global needs"):
        parse_policy({"keys": [], "tenants": {"list": {"acme": {"scope": "global"}}}})
    with pytest.raises(PolicyError, match=r"^tenants\.defaults\.scope: global needs"):
        parse_policy({"keys": [], "tenants": {"defaults": {"scope": "global"}}})
    with pytest.raises(PolicyError, match=r"^tenants\.list\.acme\.scope: expected one of"):
        parse_policy({"keys": [], "tenants": {"list": {"acme": {"scope": "world"}}}})
