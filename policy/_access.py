"""Policy sections about callers: limits, tiers, API keys, JWT, TLS, the budget store,
shadow traffic and the decision log. Readers only; `policy.loader` calls them in order."""

from __future__ import annotations

import re
from collections.abc import Mapping

from policy._reader import PolicyError, Section, expect, one_of, positive, recorded_files
from policy.apis import DEFAULT_PUBLIC_PATHS, KNOWN_API_NAMES, PathTable, api_named
from policy.domain import (
    LIMIT_FIELDS,
    ApiKey,
    Limits,
    Pool,
    TenantBook,
    Tier,
    build_caller,
    hash_api_key,
)
from policy.schema import (
    BudgetConfig,
    BudgetStoreKind,
    DecisionLogConfig,
    JwtConfig,
    ShadowConfig,
    TlsConfig,
    UnverifiedSpend,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def limit_overrides(sec: Section) -> dict[str, int]:
    """The limit fields a section sets, each >= 0; any other field is an error."""
    values: dict[str, int] = {}
    for name in LIMIT_FIELDS:
        raw = sec.raw(name)
        if raw is None:
            continue
        value = expect(raw, int, sec.child(name))
        if value < 0:
            raise PolicyError(f"{sec.child(name)}: must be >= 0")
        values[name] = value
    sec.close()
    return values


def parse_limits(sec: Section, base: Limits) -> Limits:
    """`base` with the fields the section sets."""
    overrides = limit_overrides(sec)
    return Limits(**{name: overrides.get(name, getattr(base, name)) for name in LIMIT_FIELDS})


def parse_tier(value: object, where: str) -> Tier:
    try:
        return Tier(expect(value, str, where))
    except ValueError:
        allowed = ", ".join(t.value for t in Tier)
        raise PolicyError(f"{where}: expected one of {allowed}") from None


def parse_tiers(sec: Section) -> dict[Tier, Limits]:
    limits = {}
    for tier in Tier:
        limits[tier] = parse_limits(sec.section(tier.value), Limits())
    sec.close()
    return limits


_DEFAULT_BUDGET = BudgetConfig()


def parse_shadow(raw: object, path: str, pools: Mapping[str, Pool]) -> ShadowConfig | None:
    if raw is None:
        return None
    sec = Section(raw, path)
    pool = sec.require("pool", str)
    if pool not in pools:
        raise PolicyError(f"{sec.child('pool')}: no pool named {pool!r}")
    fraction = sec.get("fraction", float, 0.01)
    if not 0.0 <= fraction <= 1.0:
        raise PolicyError(f"{sec.child('fraction')}: must be in [0, 1]")
    sec.close()
    return ShadowConfig(pool, fraction)


def parse_decision_log(raw: object, path: str) -> DecisionLogConfig | None:
    files = recorded_files(raw, path, sample_rate=0.01)
    return None if files is None else DecisionLogConfig(*files)


def parse_tls(raw: object, path: str) -> TlsConfig | None:
    if raw is None:
        return None
    sec = Section(raw, path)
    config = TlsConfig(sec.require("cert_file", str), sec.require("key_file", str))
    sec.close()
    return config


def parse_jwt(raw: object, path: str) -> JwtConfig | None:
    if raw is None:
        return None
    sec = Section(raw, path)
    issuer = sec.require("issuer", str)
    audiences_raw = sec.get("audiences", list, [])
    audiences = tuple(
        expect(a, str, f"{sec.child('audiences')}[{i}]") for i, a in enumerate(audiences_raw)
    )
    jwks_file = sec.get("jwks_file", str, "") or None
    jwks_uri = sec.get("jwks_uri", str, "") or None
    if (jwks_file is None) == (jwks_uri is None):
        raise PolicyError(f"{path}: exactly one of 'jwks_file' or 'jwks_uri' is required")
    if jwks_uri is not None and not re.match(r"^https?://[^/]+/", jwks_uri):
        raise PolicyError(f"{sec.child('jwks_uri')}: expected http(s)://host[:port]/path")
    config = JwtConfig(
        issuer=issuer,
        audiences=audiences,
        jwks_file=jwks_file,
        jwks_uri=jwks_uri,
        tenant_claim=sec.get("tenant_claim", str, "tenant"),
        tier_claim=sec.get("tier_claim", str, "tier"),
        required=sec.get("required", bool, True),
    )
    sec.close()
    return config


def parse_budget(sec: Section) -> BudgetConfig:
    store_raw = sec.get("store", str, BudgetStoreKind.MEMORY.value)
    try:
        store = BudgetStoreKind(store_raw)
    except ValueError:
        raise PolicyError(f"{sec.child('store')}: expected 'memory' or 'redis'") from None
    redis_timeout_ms = sec.get("redis_timeout_ms", float, _DEFAULT_BUDGET.redis_timeout_ms)
    positive(redis_timeout_ms, sec.child("redis_timeout_ms"))
    # Unset, the spend check waits at least as long as the budgets do.
    spend_timeout_ms = sec.get(
        "spend_timeout_ms", float, max(_DEFAULT_BUDGET.spend_timeout_ms, redis_timeout_ms)
    )
    positive(spend_timeout_ms, sec.child("spend_timeout_ms"))
    if spend_timeout_ms < redis_timeout_ms:
        raise PolicyError(
            f"{sec.child('spend_timeout_ms')}: must be at least redis_timeout_ms "
            f"({redis_timeout_ms:g}): a spend check has no local share to fall back on, "
            f"got {spend_timeout_ms:g}"
        )
    config = BudgetConfig(
        store=store,
        redis_url=sec.get("redis_url", str, _DEFAULT_BUDGET.redis_url),
        redis_cluster=sec.get("redis_cluster", bool, False),
        redis_timeout_ms=redis_timeout_ms,
        replicas=sec.get("replicas", int, 1),
        spend_timeout_ms=spend_timeout_ms,
        spend_unverified=UnverifiedSpend(
            one_of(sec, "spend_unverified", UnverifiedSpend, _DEFAULT_BUDGET.spend_unverified)
        ),
    )
    if not config.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise PolicyError(f"{sec.child('redis_url')}: expected redis://, rediss:// or unix://")
    positive(config.replicas, sec.child("replicas"))
    sec.close()
    return config


def parse_keys(
    raw: object,
    path: str,
    tier_limits: Mapping[Tier, Limits],
    tenants: TenantBook | None = None,
) -> dict[str, ApiKey]:
    """The keys. With a `tenants:` section (`tenants`), a key's tenant must be one it names
    (or any, with `tenants.defaults`), and the key inherits from it: its own tier, else its
    tenant's; its own limits, else its tenant's, else its tier's (policy.domain.build_caller)."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected a list of keys")
    keys: dict[str, ApiKey] = {}
    for i, item in enumerate(raw):
        sec = Section(item, f"{path}[{i}]")
        clear = sec.raw("key")
        hashed = sec.raw("key_sha256")
        if (clear is None) == (hashed is None):
            raise PolicyError(f"{path}[{i}]: exactly one of 'key' or 'key_sha256' is required")
        if clear is not None:
            digest = hash_api_key(expect(clear, str, sec.child("key")))
        else:
            digest = expect(hashed, str, sec.child("key_sha256")).lower()
            if not _SHA256.match(digest):
                raise PolicyError(f"{sec.child('key_sha256')}: expected 64 hex characters")
        tenant = sec.require("tenant", str)
        entry = None if tenants is None else tenants.get(tenant)
        if tenants is not None and entry is None:
            raise PolicyError(
                f"{sec.child('tenant')}: no tenant named {tenant!r} (list it in "
                "tenants.list, or set tenants.defaults for tenants not listed)"
            )
        tier_raw = sec.raw("tier")
        tier = None if tier_raw is None else parse_tier(tier_raw, sec.child("tier"))
        own_limits = limit_overrides(sec.section("limits"))
        sec.close()
        if digest in keys:
            raise PolicyError(f"{path}[{i}]: duplicate API key")
        keys[digest] = build_caller(digest, tenant, tier, own_limits, tier_limits, tenants)
    return keys


_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")


def _exact_path(value: object, where: str) -> str:
    path = expect(value, str, where)
    if not _PATH.match(path) or "//" in path or "/./" in path or "/../" in path:
        raise PolicyError(f"{where}: expected an absolute, normalised path, got {path!r}")
    if len(path) > 1 and path.endswith("/"):
        raise PolicyError(f"{where}: no trailing slash (it names the same path)")
    return path


def parse_paths(sec: Section) -> PathTable:
    """Default deny: only these paths reach a pool. `public` ones need no identity; `apis`
    names the engine APIs slogate parses and meters; `authenticated` are further exact paths
    (an operator endpoint, say) forwarded for identified callers, one request each."""
    public_raw = sec.get("public", list, list(DEFAULT_PUBLIC_PATHS))
    public = [_exact_path(p, f"{sec.child('public')}[{i}]") for i, p in enumerate(public_raw)]
    names_raw = sec.get("apis", list, list(KNOWN_API_NAMES))
    apis = []
    for i, name in enumerate(names_raw):
        where = f"{sec.child('apis')}[{i}]"
        api = api_named(expect(name, str, where))
        if api is None:
            raise PolicyError(f"{where}: unknown API {name!r}; known: {', '.join(KNOWN_API_NAMES)}")
        apis.append(api)
    extra_raw = sec.get("authenticated", list, [])
    extra = [_exact_path(p, f"{sec.child('authenticated')}[{i}]") for i, p in enumerate(extra_raw)]
    sec.close()
    seen: dict[str, str] = {}
    for kind, paths in (
        ("public", public),
        ("apis", [a.path for a in apis]),
        ("authenticated", extra),
    ):
        for path in paths:
            if path in seen:
                raise PolicyError(f"{sec.child(kind)}: {path} is listed twice ({seen[path]})")
            seen[path] = kind
    return PathTable.build(public, apis, extra)
