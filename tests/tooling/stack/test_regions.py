"""A region's policy from the example (tooling.stack.regions), read back by the loader."""

from __future__ import annotations

from pathlib import Path

import yaml

from policy.domain import BudgetScope, Tier
from policy.loader import parse_policy
from tests.support.stack import example_policy
from tooling.stack.local import StackPorts
from tooling.stack.regions import (
    GLOBAL_KEY,
    GLOBAL_TENANT,
    LedgerTiming,
    region_names,
    region_policy,
    region_ports,
    single_pool,
)


def test_a_region_policy_names_its_region_peers_ledger_and_a_global_tenant(tmp_path: Path) -> None:
    ingress = {"eu": "10.0.1.2:10000", "us": "10.0.2.2:10000"}
    raw = region_policy(
        example_policy(),
        "us",
        ingress,
        "redis://10.0.9.1:6400/0",
        tmp_path / "regions.key",
        LedgerTiming(report_interval_s=0.5, lease_s=3.0),
        global_tokens_per_minute=60_000,
    )
    policy = parse_policy(yaml.safe_load(yaml.safe_dump(raw)))
    regions = policy.regions
    assert regions.this == "us"
    assert {n: r.ingress for n, r in regions.regions.items()} == ingress
    assert regions.ledger.url == "redis://10.0.9.1:6400/0"
    assert (regions.ledger.report_interval_s, regions.ledger.lease_s) == (0.5, 3.0)
    assert regions.crossing.enabled and regions.crossing.tiers == {Tier.SHEDDABLE}
    tenant = policy.tenants.listed[GLOBAL_TENANT]
    assert tenant.scope is BudgetScope.GLOBAL
    assert tenant.limits["tokens_per_minute"] == 60_000
    key = policy.key_for(GLOBAL_KEY)
    assert key is not None and key.tenant == GLOBAL_TENANT
    # The example's own keys keep their tenants and tiers (a `defaults` entry was added).
    batch = policy.key_for("sk-demo-batch")
    assert batch is not None and batch.tier is Tier.SHEDDABLE


def test_one_pool_and_region_ports() -> None:
    raw = single_pool(example_policy())
    policy = parse_policy(raw)
    assert list(policy.pools) == ["default"] and len(policy.pools["default"].endpoints) == 1
    second = region_ports(StackPorts(), 1)
    assert (second.listen, second.admin, second.grpc) == (11000, 10901, 51051)
    assert region_ports(StackPorts(0, 0, 0, 0, 0), 2).listen == 0
    assert region_names(7) == ("eu", "us", "ap", "sa", "af", "me", "r6")
