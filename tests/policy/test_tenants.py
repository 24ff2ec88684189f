"""The `tenants:` section: what keys inherit, per-tenant objectives and weights, the errors
that name the tenant and the field, and the thousand-tenant example."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from breaker.objectives import latency_objective_s
from extproc.request.identity import caller_from_claims
from policy._reader import PolicyError
from policy.diff import policy_changes
from policy.domain import Limits, Tier, hash_api_key
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.docs import page_with

ROOT = Path(__file__).resolve().parents[2]
THOUSAND = ROOT / "deploy" / "policy.tenants.example.yaml"

TIERS = {
    "critical": {"requests_per_minute": 600, "tokens_per_minute": 2000, "concurrent_requests": 64},
    "standard": {"requests_per_minute": 300, "tokens_per_minute": 1000, "concurrent_requests": 32},
    "sheddable": {"requests_per_minute": 120, "tokens_per_minute": 500, "concurrent_requests": 16},
}
TENANTS = {
    "classes": {
        "gold": {
            "tier": "critical",
            "limits": {"tokens_per_minute": 9000, "tokens_per_hour": 50000},
            "slo": {"ttft_p99_ms": 800, "tpot_p99_ms": 30},
            "weight": 4,
        },
    },
    "list": {
        "acme": {"class": "gold", "limits": {"tokens_per_minute": 7000}, "pools": ["default"]},
        "bigco": "gold",
        "plain": {},
    },
}


def policy_with(
    tenants: Any = TENANTS, keys: list[dict[str, Any]] | None = None, **raw: Any
) -> Policy:
    return parse_policy({"tiers": TIERS, "tenants": tenants, "keys": keys or [], **raw})


def test_most_specific_wins_field_by_field_key_tenant_class_tier() -> None:
    policy = policy_with(
        keys=[
            {"key": "sk-acme", "tenant": "acme"},
            {
                "key": "sk-acme-own",
                "tenant": "acme",
                "tier": "sheddable",
                "limits": {"concurrent_requests": 2},
            },
            {"key": "sk-bigco", "tenant": "bigco"},
            {"key": "sk-plain", "tenant": "plain"},
        ]
    )
    acme = policy.key_for("sk-acme")
    assert acme is not None and acme.tier is Tier.CRITICAL  # the class's tier
    # The tenant's own tokens_per_minute, the class's tokens_per_hour, the tier's rest.
    assert acme.limits == Limits(600, 7000, 50000, 64, None)
    own = policy.key_for("sk-acme-own")
    # The key's own tier and limit win; the tenant's and class's overrides still apply,
    # over the key's tier's limits.
    assert own is not None and own.tier is Tier.SHEDDABLE
    assert own.limits == Limits(120, 7000, 50000, 2, None)
    bigco = policy.key_for("sk-bigco")
    assert bigco is not None and bigco.limits == Limits(600, 9000, 50000, 64, None)
    plain = policy.key_for("sk-plain")  # listed, no class, no defaults: standard, as before
    assert plain is not None and plain.tier is Tier.STANDARD
    assert plain.limits == Limits(300, 1000, None, 32, None)


def test_without_a_tenants_section_keys_are_as_before() -> None:
    keys = [{"key": "sk-x", "tenant": "anyone", "tier": "critical"}, {"key": "sk-y", "tenant": "y"}]
    policy = parse_policy({"tiers": TIERS, "keys": keys})
    x, y = policy.key_for("sk-x"), policy.key_for("sk-y")
    assert x is not None and x.limits == Limits(600, 2000, None, 64, None)
    assert y is not None and y.tier is Tier.STANDARD
    assert policy.tenants.get("anyone") is None
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "anyone") == policy.slo_ms(Tier.CRITICAL, "0-4k")


def test_a_key_must_name_a_listed_tenant_unless_defaults_admit_any() -> None:
    keys = [{"key": "sk-1", "tenant": "acme"}, {"key": "sk-2", "tenant": "acme2"}]
    with pytest.raises(PolicyError, match=r"^keys\[1\]\.tenant: no tenant named 'acme2'"):
        policy_with(keys=keys)
    policy = policy_with({**TENANTS, "defaults": {"class": "gold", "weight": 2}}, keys=keys)
    unlisted = policy.key_for("sk-2")
    assert unlisted is not None and unlisted.tier is Tier.CRITICAL
    assert unlisted.limits.tokens_per_minute == 9000
    assert policy.waiting_room.tenant_weights.get("acme2", 1.0) == 2.0  # the defaults' weight
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "acme2") == 800


def test_an_entry_without_a_class_builds_on_the_defaults() -> None:
    tenants = {
        "defaults": "gold",  # shorthand for {class: gold}
        "classes": TENANTS["classes"],
        "list": {"frozen": {"suspended": True}, "big": {"limits": {"tokens_per_minute": 1}}},
    }
    policy = policy_with(tenants)
    frozen, big = policy.tenants.listed["frozen"], policy.tenants.listed["big"]
    assert frozen.suspended and frozen.tier is Tier.CRITICAL and frozen.tenant_class == "gold"
    assert big.limits == {"tokens_per_minute": 1, "tokens_per_hour": 50000}
    assert not big.suspended and big.ttft_ms("0-4k") == 800


def test_a_tenants_objectives_replace_its_tiers() -> None:
    tenants = {
        **TENANTS,
        "list": {
            **TENANTS["list"],
            "per-bucket": {"slo": {"ttft_p99_ms": {"default": 500, "32k-128k": 3000}}},
        },
    }
    policy = policy_with(tenants, slos={"critical": {"default": 2000, "32k-128k": 6000}})
    assert policy.slo_ms(Tier.CRITICAL, "0-4k") == 2000
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "acme") == 800  # the class's, every bucket
    assert policy.slo_ms(Tier.CRITICAL, "32k-128k", "acme") == 800
    assert policy.slo_ms(Tier.STANDARD, "32k-128k", "per-bucket") == 3000
    assert policy.slo_ms(Tier.STANDARD, "4-8k", "per-bucket") == 500
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "plain") == 2000  # sets none: its tier's
    # The breaker's judgement: a stream's TTFT, a JSON answer's whole time.
    assert latency_objective_s(policy, Tier.CRITICAL, "0-4k", True, None, "acme") == 0.8
    assert latency_objective_s(policy, Tier.CRITICAL, "0-4k", False, 101, "acme") == (
        pytest.approx(0.8 + 100 * 0.030)
    )
    tier_tpot = policy.slo_tpot_p99_ms[Tier.CRITICAL]
    assert latency_objective_s(policy, Tier.CRITICAL, "0-4k", False, 101, "plain") == (
        pytest.approx(2.0 + 100 * tier_tpot / 1000)
    )
    # The waiting room's wait is derived from the request's own objective.
    assert policy.max_wait_s(Tier.CRITICAL, "default", "0-4k", 100, "acme") == pytest.approx(0.4)
    assert policy.max_wait_s(Tier.CRITICAL, "default", "0-4k", 100) == pytest.approx(1.0)


def test_the_longest_wait_allows_for_a_tenant_objective_longer_than_any_tier() -> None:
    slos = {t: {"default": 1000} for t in TIERS}
    slow = {"list": {"patient": {"slo": {"ttft_p99_ms": 30000}}}}
    assert parse_policy({"slos": slos}).longest_wait_s == 1.0
    assert policy_with(slow, slos=slos).longest_wait_s == 30.0  # Envoy must wait as long


def test_weights_the_tenants_own_then_tenant_weights_then_its_class() -> None:
    room = {"tenant_weights": {"bigco": 3, "jwt-only": 5}}
    policy = policy_with(waiting_room=room)
    weights = policy.waiting_room.tenant_weights
    assert weights.get("acme", 1.0) == 4.0  # its class's
    assert weights.get("bigco", 1.0) == 3.0  # named in tenant_weights: over its class's
    assert weights.get("jwt-only", 1.0) == 5.0  # not a listed tenant: kept
    assert weights.get("plain", 1.0) == 1.0 and weights.get("unknown", 1.0) == 1.0
    clash = {"list": {"bigco": {"class": "gold", "weight": 2}}, "classes": TENANTS["classes"]}
    with pytest.raises(PolicyError, match=r"^tenants\.list\.bigco\.weight: waiting_room"):
        policy_with(clash, waiting_room=room)


def test_a_jwt_caller_of_a_known_tenant_inherits_like_its_keys() -> None:
    jwt = {"issuer": "https://auth.example.com/", "jwks_file": "/dev/null"}
    policy = policy_with(jwt=jwt)
    caller = caller_from_claims(policy, {"tenant": "acme", "sub": "u1"})
    assert caller.tier is Tier.CRITICAL and caller.limits.tokens_per_minute == 7000
    named = caller_from_claims(policy, {"tenant": "acme", "sub": "u1", "tier": "sheddable"})
    assert named.tier is Tier.SHEDDABLE and named.limits.requests_per_minute == 120
    stranger = caller_from_claims(policy, {"tenant": "nobody", "sub": "u2"})
    assert stranger.tier is Tier.STANDARD and stranger.limits == Limits(300, 1000, None, 32)


@pytest.mark.parametrize(
    ("tenants", "error"),
    [
        (
            {"list": {"acme": {"limits": {"tokens_per_minute": -1}}}},
            "tenants.list.acme.limits.tokens_per_minute: must be >= 0",
        ),
        ({"list": {"acme": {"class": "gld"}}}, "tenants.list.acme.class: no class named 'gld'"),
        ({"list": {"acme": "gld"}}, "tenants.list.acme.class: no class named 'gld'"),
        ({"list": {"acme": {"tier": "gold"}}}, "tenants.list.acme.tier: expected one of"),
        (
            {"list": {"acme": {"pools": ["default", "gpu"]}}},
            "tenants.list.acme.pools[1]: no pool named 'gpu'",
        ),
        ({"list": {"acme": {"pools": []}}}, "tenants.list.acme.pools: name at least one pool"),
        ({"list": {"acme": {"weight": 0}}}, "tenants.list.acme.weight: must be > 0"),
        ({"list": {"acme": {"suspended": "yes"}}}, "tenants.list.acme.suspended: expected bool"),
        (
            {"list": {"acme": {"slo": {"ttft_p99_ms": {"1k": 5}}}}},
            "tenants.list.acme.slo.ttft_p99_ms.1k: no bucket named '1k'",
        ),
        (
            {"list": {"acme": {"slo": {"ttft_p99_ms": 0}}}},
            "tenants.list.acme.slo.ttft_p99_ms: must be > 0",
        ),
        (
            {"list": {"acme": {"slo": {"ttfb_ms": 5}}}},
            "tenants.list.acme.slo.ttfb_ms: unknown field",
        ),
        ({"list": {"acme": {"colour": "red"}}}, "tenants.list.acme.colour: unknown field"),
        ({"list": ["acme"]}, "tenants.list: expected a mapping"),
        ({"classes": {"gold": {"class": "silver"}}}, "tenants.classes.gold.class: unknown field"),
        (
            {"defaults": {"limits": {"concurrent_requests": -2}}},
            "tenants.defaults.limits.concurrent_requests: must be >= 0",
        ),
        ({"teams": {}}, "tenants.teams: unknown field"),
        (
            {"list": {"acme": {"inference_objective": "Acme_Chat"}}},
            "tenants.list.acme.inference_objective: 'Acme_Chat' is not a Kubernetes object name",
        ),
        (
            {"list": {"acme": {"inference_objective": 7}}},
            "tenants.list.acme.inference_objective: expected str",
        ),
        (
            {
                "list": {
                    "acme": {"tier": "critical", "inference_objective": "chat"},
                    "etl": {"tier": "sheddable", "inference_objective": "chat"},
                }
            },
            "tenants.list.etl.inference_objective: 'chat' is tenants.list.acme's, of tier critical",
        ),
        (
            {"list": {"acme": {"tier": "critical", "inference_objective": "slogate-standard"}}},
            "tenants.list.acme.inference_objective: 'slogate-standard' is tier standard's",
        ),
    ],
)
def test_errors_name_the_tenant_and_the_field(tenants: dict[str, Any], error: str) -> None:
    with pytest.raises(PolicyError, match="^" + re.escape(error)):
        parse_policy({"tenants": tenants})


def test_a_thousand_tenants_read_as_a_few_dozen_lines() -> None:
    """The example: classes, defaults and the exceptions; a generator adds one key line per
    tenant and nothing else."""
    text = THOUSAND.read_text()
    section = text[text.index("tenants:") : text.index("keys:")]
    assert len([line for line in section.splitlines() if line.strip()]) < 50
    raw = yaml.safe_load(text)
    raw["keys"] += [
        {"key_sha256": hash_api_key(f"sk-t{i:04d}"), "tenant": f"t{i:04d}"} for i in range(2, 1000)
    ]
    policy = parse_policy(raw)
    assert len(policy.keys) == 1002
    tenants = {policy.key_for(f"sk-t{i:04d}").tenant for i in range(2, 1000)}  # type: ignore[union-attr]
    assert len(tenants) == 998
    anyone = policy.key_for("sk-t0500")
    assert anyone is not None and anyone.tier is Tier.STANDARD
    assert anyone.limits.tokens_per_minute == 200000 and anyone.limits.concurrent_requests == 8
    acme = policy.key_for("sk-acme-prod")
    assert acme is not None and acme.tier is Tier.CRITICAL and acme.limits.concurrent_requests == 64
    batch = policy.key_for("sk-acme-batch")
    assert (
        batch is not None and batch.tier is Tier.SHEDDABLE and batch.limits.concurrent_requests == 4
    )
    assert policy.slo_ms(Tier.CRITICAL, "32k-128k", "globex") == 4000
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "globex") == 800
    assert policy.tenants.listed["t0042"].suspended
    assert policy.tenants.listed["hooli"].pools == frozenset({"default"})
    assert policy.waiting_room.tenant_weights.get("nightly-etl", 1.0) == 0.5


def commented_tenants(text: str) -> str:
    """The example policy's commented-out `tenants:` section, uncommented."""
    lines = text[text.index("# tenants:") :].splitlines()
    taken = [lines[0][2:]]
    for line in lines[1:]:
        if not line.startswith("#   "):
            break  # the section ends at the first line that is not indented under it
        taken.append(line[2:])
    return "\n".join(taken)


def test_the_documented_examples_load_and_mean_what_they_say() -> None:
    example = yaml.safe_load((ROOT / "deploy" / "policy.example.yaml").read_text())
    example["tenants"] = yaml.safe_load(
        commented_tenants((ROOT / "deploy" / "policy.example.yaml").read_text())
    )["tenants"]
    policy = parse_policy(example)
    critical = policy.key_for("sk-demo-critical")
    assert critical is not None and critical.limits.tokens_per_minute == 4_000_000
    assert policy.slo_ms(Tier.CRITICAL, "0-4k", "demo-critical") == 800
    assert policy.tenants.listed["demo-batch"].pools == frozenset({"default"})
    assert policy.tenants.listed["demo-unpaid"].suspended
    heading = "## Tenants\n"  # docs/operators/tenants.md
    readme = page_with(heading)
    section = readme[readme.index(heading) :]
    block = section[section.index("```yaml") + len("```yaml") : section.index("```\n\n")]
    documented = parse_policy(yaml.safe_load(block))
    acme = documented.key_for("sk-acme-prod")
    assert acme is not None and acme.tier is Tier.CRITICAL
    assert documented.tenants.listed["unpaid"].limits == {"tokens_per_minute": 200000}
    assert documented.tenants.listed["bigco"].limits["tokens_per_minute"] == 8_000_000


def test_a_tenants_inference_objective_is_named_by_its_keys_of_its_tier() -> None:
    """`inference_objective` is inherited like the rest (class, defaults); a key or a token
    of another tier names its tier's objective (the tenant's has the tenant's priority)."""
    jwt = {"issuer": "https://auth.example.com/", "jwks_file": "/dev/null"}
    tenants = {
        "defaults": {"inference_objective": "self-serve.chat"},
        "classes": {"gold": {"tier": "critical", "inference_objective": "gold"}},
        "list": {"acme": "gold", "bigco": {"class": "gold", "inference_objective": "bigco"}},
    }
    policy = policy_with(
        tenants,
        keys=[
            {"key": "sk-acme", "tenant": "acme"},
            {"key": "sk-acme-batch", "tenant": "acme", "tier": "sheddable"},
            {"key": "sk-bigco", "tenant": "bigco"},
            {"key": "sk-new", "tenant": "t0001"},
        ],
        jwt=jwt,
    )
    callers = {k: policy.key_for(k) for k in ("sk-acme", "sk-acme-batch", "sk-bigco", "sk-new")}
    objective = {k: c.objective for k, c in callers.items() if c is not None}
    assert objective == {
        "sk-acme": "gold",
        "sk-acme-batch": "slogate-sheddable",
        "sk-bigco": "bigco",
        "sk-new": "self-serve.chat",
    }
    assert caller_from_claims(policy, {"tenant": "acme", "sub": "u"}).objective == "gold"
    other = caller_from_claims(policy, {"tenant": "acme", "sub": "u", "tier": "standard"})
    assert other.objective == "slogate-standard"


def test_policy_diff_names_a_changed_inference_objective() -> None:
    old = policy_with({"list": {"acme": {"tier": "critical"}}})
    new = policy_with({"list": {"acme": {"tier": "critical", "inference_objective": "acme"}}})
    said = policy_changes(old, new)
    assert any("inference objective unset → acme" in line for line in said), said
