"""The policy loader: defaults, strictness, and errors that name the bad field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policy._reader import PolicyError
from policy.domain import Tier, hash_api_key
from policy.loader import load_policy, parse_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"


def test_example_policy_loads_with_demo_keys_one_per_tier() -> None:
    policy = load_policy(EXAMPLE)
    tiers = {
        policy.key_for(k).tier for k in ("sk-demo-critical", "sk-demo-standard", "sk-demo-batch")
    }  # type: ignore[union-attr]
    assert tiers == {Tier.CRITICAL, Tier.STANDARD, Tier.SHEDDABLE}
    assert set(policy.pools) == {"default", "long", "fallback"}
    assert policy.key_for("sk-nope") is None


def test_defaults_route_long_contexts_to_long_pool() -> None:
    policy = parse_policy({})
    assert policy.pool_for(1000) == "default"
    assert policy.pool_for(32768) == "default"
    assert policy.pool_for(32769) == "long"
    assert [b.name for b in policy.buckets] == ["0-4k", "4-8k", "8-32k", "32k-128k", "128k+"]
    assert policy.bucket_for(0).name == "0-4k"
    assert policy.bucket_for(4096).name == "0-4k"
    assert policy.bucket_for(4097).name == "4-8k"
    assert policy.bucket_for(10**9).name == "128k+"
    weights = [b.cost_weight for b in policy.buckets]
    assert weights == sorted(weights) and weights[0] == 1.0


def test_keys_can_be_stored_hashed() -> None:
    digest = hash_api_key("sk-secret")
    policy = parse_policy({"keys": [{"key_sha256": digest, "tenant": "t", "tier": "critical"}]})
    key = policy.key_for("sk-secret")
    assert key is not None and key.tenant == "t" and key.tier is Tier.CRITICAL
    assert "sk-secret" not in repr(policy) and key.key_id == digest[:12]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"modle": {}}, "modle"),
        ({"model": {"max_context_tokens": "big"}}, "model.max_context_tokens"),
        ({"model": {"max_context_tokens": True}}, "model.max_context_tokens"),
        ({"model": {"default_max_tokens": -5}}, "model.default_max_tokens"),
        ({"request": {"failure_mode": "sideways"}}, "request.failure_mode"),
        ({"pools": {"default": {"endpoints": ["nohost"]}}}, "pools.default.endpoints[0]"),
        ({"pools": {"default": {"endpoints": ["a:1"], "weight": 2}}}, "pools.default.weight"),
        ({"routing": {"rules": [{"pool": "missing"}]}}, "routing.rules[0].pool"),
        ({"routing": {"default_pool": "gone"}}, "routing.default_pool"),
        ({"keys": [{"key": "k", "tenant": "t", "tier": "gold"}]}, "keys[0].tier"),
        ({"keys": [{"tenant": "t"}]}, "keys[0]"),
        ({"keys": [{"key": "k", "tenant": "t", "colour": "red"}]}, "keys[0].colour"),
        ({"keys": [{"key_sha256": "abc", "tenant": "t"}]}, "keys[0].key_sha256"),
        (
            {
                "buckets": [
                    {"name": "a", "max_tokens": 10},
                    {"name": "b", "max_tokens": 5},
                    {"name": "c"},
                ]
            },
            "buckets[1].max_tokens",
        ),
        ({"buckets": [{"name": "a", "max_tokens": 10}]}, "buckets[0].max_tokens"),
        ({"counting": {"workers": 0}}, "counting.workers"),
        ({"counting": {"engine": "sentencepiece"}}, "counting.engine"),
        ({"counting": {"exact_margin": 0.15}}, "counting.exact_margin"),
        ({"request": {"max_sequences": 0}}, "request.max_sequences"),
        ({"paths": {"apis": ["chat"]}}, "paths.apis[0]"),
        ({"paths": {"public": ["/health/"]}}, "paths.public[0]"),
        ({"paths": {"public": ["health"]}}, "paths.public[0]"),
        ({"paths": {"authenticated": ["/a/../b"]}}, "paths.authenticated[0]"),
        ({"paths": {"public": ["/v1/models"]}}, "paths.apis"),
        ({"paths": {"colour": []}}, "paths.colour"),
        # The global breaker's name: a pool called so would share its metrics and drills.
        ({"pools": {"global": {"endpoints": ["a:1"]}}}, "pools.global"),
    ],
)
def test_bad_fields_are_named_by_path(raw: dict[str, object], path: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(raw)
    assert str(info.value).startswith(path + ":"), str(info.value)


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(PolicyError, match="duplicate"):
        parse_policy({"keys": [{"key": "k", "tenant": "a"}, {"key": "k", "tenant": "b"}]})


def test_not_yaml_is_a_policy_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)


def test_paths_default_to_health_public_and_every_known_api() -> None:
    from policy.apis import KNOWN_APIS, PathClass

    paths = parse_policy({}).paths
    assert paths.public == {"/health"}
    assert set(paths.apis) == {api.path for api in KNOWN_APIS}
    assert paths.classify("/scale_elastic_ep")[0] is PathClass.UNKNOWN
    narrow = parse_policy(
        {"paths": {"apis": ["chat_completions"], "public": [], "authenticated": ["/sleep"]}}
    ).paths
    assert narrow.classify("/v1/completions")[0] is PathClass.UNKNOWN
    assert narrow.classify("/health")[0] is PathClass.UNKNOWN
    kind, api = narrow.classify("/sleep")
    assert kind is PathClass.API and api is not None and api.name == "path:/sleep"


def test_kv_admission_settings_are_checked() -> None:
    policy = parse_policy(
        {
            "pools": {"default": {"endpoints": ["127.0.0.1:1"], "kv_capacity_tokens": 500_000}},
            "routing": {"fallback_pool": "default"},
            "breaker": {"kv_shares": {"sheddable": 0.7}},
        }
    )
    assert policy.pools["default"].kv_capacity_tokens == 500_000
    assert policy.breaker.kv_shares[Tier.SHEDDABLE] == 0.7
    assert policy.breaker.kv_shares[Tier.STANDARD] == 0.95  # the default stays
    assert policy.buckets[2].kv_weight == 4.2  # the field's 8-32k KV factor
    bad = [
        ({"breaker": {"kv_shares": {"critical": 0}}}, "breaker.kv_shares.critical"),
        ({"breaker": {"kv_shares": {"standard": 0.5}}}, "breaker.kv_shares.sheddable"),
        ({"breaker": {"kv_shares": {"everyone": 0.5}}}, "breaker.kv_shares"),
        (
            {"pools": {"default": {"endpoints": ["h:1"], "kv_capacity_tokens": -1}}},
            "pools.default.kv_capacity_tokens",
        ),
        (
            {"pools": {"default": {"endpoints": ["h:1"], "kv_capacity_tokens": "lots"}}},
            "pools.default.kv_capacity_tokens",
        ),
        ({"buckets": [{"name": "all", "kv_weight": 0}]}, "buckets[0].kv_weight"),
    ]
    for raw, where in bad:
        with pytest.raises(PolicyError, match=re.escape(where)):
            parse_policy(raw)
