"""The policy file: documented YAML schema -> defaults -> validation -> frozen `Policy`.

What lives here: one reader per section of the file and `load_policy` / `parse_policy`.
Every error names the path of the bad field (`pools.long.endpoints[0]`), and an unknown
field is an error, so a typo never silently falls back to a default. The schema itself is
documented in deploy/policy.example.yaml; the frozen objects live in `policy.schema`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from policy._access import (
    parse_budget,
    parse_decision_log,
    parse_jwt,
    parse_keys,
    parse_paths,
    parse_shadow,
    parse_tiers,
    parse_tls,
)
from policy._ahead import parse_ahead
from policy._data_path import parse_data_path
from policy._engines import parse_engines
from policy._fleet import (
    parse_breaker,
    parse_buckets,
    parse_counting,
    parse_latency_models,
    parse_pools,
    parse_rules,
    parse_slos,
    parse_tpot_slos,
    parse_waiting_room,
)
from policy._forecast import parse_forecast
from policy._keystore import parse_key_store
from policy._reader import PolicyError, Section, positive
from policy._regions import parse_regions
from policy._telemetry import parse_telemetry
from policy._tenants import parse_tenants
from policy._traffic import parse_traffic_record
from policy.domain import BudgetScope, FailureMode, TenantBook
from policy.schema import CandidateConfig, Policy


def parse_policy(raw: object, source: str = "<memory>") -> Policy:
    root = Section(raw, "")
    root.get("version", int, 1)

    model = root.section("model")
    model_name = model.get("name", str, "deepseek-v4")
    fallback_model = model.get("fallback_model", str, "") or None
    max_context = model.get("max_context_tokens", int, 131072)
    positive(max_context, model.child("max_context_tokens"))
    default_max_tokens = model.get("default_max_tokens", int, 1024)
    positive(default_max_tokens, model.child("default_max_tokens"))
    model.close()

    request = root.section("request")
    max_body_bytes = request.get("max_body_bytes", int, 16 * 1024 * 1024)
    positive(max_body_bytes, request.child("max_body_bytes"))
    message_timeout_ms = request.get("message_timeout_ms", int, 1000)
    positive(message_timeout_ms, request.child("message_timeout_ms"))
    upstream_timeout_s = request.get("upstream_timeout_s", float, 600.0)
    positive(upstream_timeout_s, request.child("upstream_timeout_s"))
    max_sequences = request.get("max_sequences", int, 16)
    positive(max_sequences, request.child("max_sequences"))
    failure_raw = request.get("failure_mode", str, FailureMode.CLOSED.value)
    try:
        failure_mode = FailureMode(failure_raw)
    except ValueError:
        raise PolicyError(
            f"{request.child('failure_mode')}: expected 'closed' or 'open', got {failure_raw!r}"
        ) from None
    by_path_raw = request.raw("failure_mode_by_path") or {}
    if not isinstance(by_path_raw, dict):
        raise PolicyError(f"{request.child('failure_mode_by_path')}: expected path -> mode")
    failure_by_path: dict[str, FailureMode] = {}
    for prefix, mode in by_path_raw.items():
        path = f"{request.child('failure_mode_by_path')}.{prefix}"
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise PolicyError(f"{path}: path prefixes start with '/'")
        try:
            failure_by_path[prefix] = FailureMode(mode)
        except ValueError:
            raise PolicyError(f"{path}: expected 'closed' or 'open', got {mode!r}") from None
    request.close()

    counting = parse_counting(root.section("counting"))

    buckets = parse_buckets(root.raw("buckets"), root.child("buckets"))
    pools = parse_pools(root.raw("pools"), root.child("pools"))

    routing = root.section("routing")
    default_pool = routing.get("default_pool", str, "default")
    routing_fallback = routing.get(
        "fallback_pool", str, "fallback" if "fallback" in pools else default_pool
    )
    if routing_fallback not in pools:
        raise PolicyError(f"{routing.child('fallback_pool')}: no pool named {routing_fallback!r}")
    if default_pool not in pools:
        raise PolicyError(f"{routing.child('default_pool')}: no pool named {default_pool!r}")
    rules_raw = routing.raw("rules")
    if rules_raw is None:
        rules_raw = [{"pool": "long", "min_context_tokens": 32769}] if "long" in pools else []
    route_rules = parse_rules(rules_raw, routing.child("rules"), pools)
    routing.close()

    budget = parse_budget(root.section("budget"))
    tls = parse_tls(root.raw("tls"), root.child("tls"))
    shadow = parse_shadow(root.raw("shadow"), root.child("shadow"), pools)
    decision_log = parse_decision_log(root.raw("decision_log"), root.child("decision_log"))
    traffic_record = parse_traffic_record(root.raw("traffic_record"), root.child("traffic_record"))
    latency_models = parse_latency_models(
        root.raw("latency_model"), root.child("latency_model"), pools, buckets
    )
    jwt = parse_jwt(root.raw("jwt"), root.child("jwt"))
    paths = parse_paths(root.section("paths"))
    breaker = parse_breaker(root.section("breaker"))
    waiting_room = parse_waiting_room(root.section("waiting_room"))
    engines = parse_engines(root.section("engines"))
    bucket_names = {b.name for b in buckets}
    slos = parse_slos(root.section("slos"), bucket_names)
    tpot_slos = parse_tpot_slos(root.section("tpot_slos"))
    fallback_pool = routing_fallback

    tier_limits = parse_tiers(root.section("tiers"))
    tenants = parse_tenants(
        root.raw("tenants"), root.child("tenants"), pools, bucket_names, waiting_room.tenant_weights
    )
    book = None
    if tenants is not None:
        book, weights = tenants
        waiting_room = dataclasses.replace(waiting_room, tenant_weights=weights)
    keys = parse_keys(root.raw("keys"), root.child("keys"), tier_limits, book)
    key_store = parse_key_store(
        root.raw("key_store"), root.child("key_store"), budget.store.value == "redis"
    )
    candidate = parse_candidate(root.raw("candidate"), root.child("candidate"))
    telemetry = parse_telemetry(root.section("telemetry"))
    data_path = parse_data_path(root.section("data_path"))
    forecast = parse_forecast(
        root.section("forecast"), None if traffic_record is None else traffic_record.keep_days
    )
    ahead = parse_ahead(root.raw("ahead"), root.child("ahead"))
    learning = [e.name for e in (ahead.events if ahead is not None else ()) if e.learn]
    if learning and not forecast.enabled:
        # The forecast's refit is what reads the record and learns the multiple: without it
        # the event would never raise anything, silently.
        raise PolicyError(
            f"{root.child('ahead')}.calendar[{learning[0]}].learn: a learned multiple is "
            "learned by the forecast's refit from the traffic record: enable the forecast "
            "(forecast.enabled: true, with a traffic_record) or give the event a multiple"
        )
    regions = parse_regions(root.section("regions"))
    if not regions.enabled and book is not None:
        global_ones = sorted(n for n, t in book.listed.items() if t.scope is BudgetScope.GLOBAL)
        if global_ones or (book.default is not None and book.default.scope is BudgetScope.GLOBAL):
            where = f"list.{global_ones[0]}" if global_ones else "defaults"
            raise PolicyError(
                f"{root.child('tenants')}.{where}.scope: global needs the regions section "
                "(in one region its budgets are already the fleet's)"
            )
    root.close()

    return Policy(
        model_name=model_name,
        max_context_tokens=max_context,
        default_max_tokens=default_max_tokens,
        max_body_bytes=max_body_bytes,
        message_timeout_ms=message_timeout_ms,
        upstream_timeout_s=upstream_timeout_s,
        failure_mode=failure_mode,
        failure_mode_by_path=failure_by_path,
        counting=counting,
        buckets=buckets,
        pools=pools,
        default_pool=default_pool,
        route_rules=route_rules,
        keys=keys,
        budget=budget,
        breaker=breaker,
        waiting_room=waiting_room,
        engines=engines,
        fallback_pool=fallback_pool,
        fallback_model=fallback_model,
        slo_ttft_p99_ms=slos,
        slo_tpot_p99_ms=tpot_slos,
        tls=tls,
        jwt=jwt,
        tier_limits=tier_limits,
        tenants=TenantBook() if book is None else book,
        shadow=shadow,
        decision_log=decision_log,
        traffic_record=traffic_record,
        latency_models=latency_models,
        paths=paths,
        max_sequences=max_sequences,
        source=source,
        key_store=key_store,
        candidate=candidate,
        telemetry=telemetry,
        data_path=data_path,
        forecast=forecast,
        ahead=ahead,
        regions=regions,
    )


def parse_candidate(raw: object, path: str) -> CandidateConfig | None:
    """`candidate: {file: candidate.yaml}`: the file is read by policy.candidate."""
    if raw is None:
        return None
    sec = Section(raw, path)
    file = sec.require("file", str)
    if not file:
        raise PolicyError(f"{sec.child('file')}: names no file")
    sec.close()
    return CandidateConfig(file)


# libyaml's loader when PyYAML was built with it (its wheels are): the same safe subset,
# 3-4x faster on a ten-thousand-key policy (2.7 s -> 0.8 s here).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_policy(path: str | Path) -> Policy:
    return policy_from_text(read_policy_text(path), str(path))


def read_policy_text(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")


def policy_from_text(text: str, source: str) -> Policy:
    """The policy a file's text holds: the same text always builds an equal policy (nothing
    else is read), which is what lets a reload reuse what an unchanged part built."""
    try:
        raw = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise PolicyError(f"<root>: not valid YAML: {exc}") from None
    return parse_policy(raw if raw is not None else {}, source=source)
