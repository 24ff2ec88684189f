"""The slogate policy: documented YAML schema -> defaults -> validation -> frozen runtime object.

What lives here: the schema (as the strict reader below), its defaults and the frozen
`Policy` the request path reads. Nothing here does I/O except `load_policy` reading the file.
Every error names the path of the bad field (`pools.long.endpoints[0]`), and an unknown
field is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from breaker.levels import BreakerThresholds
from budget.ledger import Limits

T = TypeVar("T")


class PolicyError(ValueError):
    """A policy that cannot be used; the message starts with the path of the bad field."""


class Tier(StrEnum):
    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"


class FailureMode(StrEnum):
    CLOSED = "closed"  # sidecar unreachable -> Envoy refuses the request
    OPEN = "open"  # sidecar unreachable -> Envoy forwards the request unchecked


@dataclass(frozen=True, slots=True)
class ContextBucket:
    """A context-length range; `max_tokens` is inclusive, None means unbounded."""

    name: str
    min_tokens: int
    max_tokens: int | None
    cost_weight: float
    # KV-cache memory per token relative to a short request (the field: 1x / 1.8x / 4.2x);
    # what a request of this bucket holds in the engine's cache, for KV admission.
    kv_weight: float = 1.0

    def contains(self, context_tokens: int) -> bool:
        return context_tokens >= self.min_tokens and (
            self.max_tokens is None or context_tokens <= self.max_tokens
        )


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    endpoints: tuple[tuple[str, int], ...]
    # The pool's KV cache in tokens and its batch slots (vLLM max_num_seqs), all endpoints
    # together. Set: requests are admitted against what is in flight (breaker.kv_shares per
    # tier). None: not limited.
    kv_capacity_tokens: int | None = None
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """A pool's measured latency model (`slogate calibrate`): what the simulator plays."""

    base_latency_ms: float  # TTFT of a tiny request at empty load, network excluded
    prefill_ms_per_1k_tokens: float  # in the first context bucket
    bucket_slopes: Mapping[str, float]  # bucket name -> prefill cost relative to the first


@dataclass(frozen=True, slots=True)
class RouteRule:
    """Send requests whose context lies in [min, max] tokens to `pool`."""

    pool: str
    min_context_tokens: int
    max_context_tokens: int | None

    def matches(self, context_tokens: int) -> bool:
        return context_tokens >= self.min_context_tokens and (
            self.max_context_tokens is None or context_tokens <= self.max_context_tokens
        )


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as the policy knows it: only its SHA-256 is kept in memory."""

    key_sha256: str
    tenant: str
    tier: Tier
    limits: Limits = field(default_factory=Limits)  # tier defaults + this key's overrides
    from_jwt: bool = False  # a JWT caller: tenant named by a claim, not by the policy

    @property
    def tenant_label(self) -> str:
        """The tenant as a metric label: policy tenants are few and known; JWT tenants are
        whatever a claim says, so they share one label to keep cardinality bounded."""
        return "jwt" if self.from_jwt else self.tenant

    @property
    def key_id(self) -> str:
        """Short, non-reversible name for logs and admin views; never the key itself."""
        return self.key_sha256[:12]


class BudgetStoreKind(StrEnum):
    MEMORY = "memory"  # in-process: one sidecar, nothing to run beside it
    REDIS = "redis"  # shared by every sidecar replica


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    store: BudgetStoreKind = BudgetStoreKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    redis_timeout_ms: float = 10.0  # past this a decision falls back to local budgets
    replicas: int = 1  # sidecars sharing the budgets; each keeps 1/replicas when degraded


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """Mirror a sampled share of routed inference requests to a shadow pool (Envoy)."""

    pool: str
    fraction: float  # 0..1


@dataclass(frozen=True, slots=True)
class DecisionLogConfig:
    directory: str
    sample_rate: float = 0.01
    keep_days: int = 7


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_file: str
    key_file: str


@dataclass(frozen=True, slots=True)
class JwtConfig:
    """Callers identified by a JWT that Envoy verified (jwt_authn) instead of an API key."""

    issuer: str
    audiences: tuple[str, ...]
    jwks_file: str | None  # a local JWKS file, or
    jwks_uri: str | None  # a remote JWKS (https://host[:port]/path), cached by Envoy
    tenant_claim: str = "tenant"
    tier_claim: str = "tier"
    required: bool = True  # False: requests without a token fall back to API keys


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    thresholds: BreakerThresholds = field(default_factory=BreakerThresholds)
    window_s: float = 60.0  # latency and error windows the breaker reads
    min_samples: int = 20  # fewer responses in the window: no latency / error signal
    evaluate_interval_s: float = 1.0
    scrape_metrics: bool = True  # scrape vLLM /metrics of every pool endpoint
    scrape_interval_s: float = 5.0
    stale_after_s: float = 15.0  # engine metrics older than this count as saturated
    # The dynamic quota controller (breaker/controller.py): tier multipliers on budgets.
    controller_enabled: bool = True
    controller_interval_s: float = 5.0
    controller_key_budgets: bool = False  # enforce per-key dynamic budgets (else: shown only)
    latency_weight: float = 0.7
    kv_weight: float = 0.3
    # KV admission: the share of a pool's KV capacity each tier may fill with what is in
    # flight. Lower tiers stop short so that a burst of critical traffic finds room.
    kv_shares: Mapping[Tier, float] = field(
        default_factory=lambda: {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.95, Tier.SHEDDABLE: 0.85}
    )


@dataclass(frozen=True, slots=True)
class Policy:
    model_name: str
    max_context_tokens: int
    default_max_tokens: int
    max_body_bytes: int
    message_timeout_ms: int
    upstream_timeout_s: float
    failure_mode: FailureMode
    exact_margin: float
    exact_max_bytes: int
    per_message_overhead_tokens: int
    buckets: tuple[ContextBucket, ...]
    pools: Mapping[str, Pool]
    default_pool: str
    route_rules: tuple[RouteRule, ...]
    keys: Mapping[str, ApiKey] = field(repr=False)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    breaker: BreakerConfig = field(default_factory=lambda: BreakerConfig())
    fallback_pool: str = "fallback"
    fallback_model: str | None = None  # None: keep the requested model at L3
    # P99 TTFT SLO in ms per (tier, bucket name); "*" is the tier's default for any bucket.
    slo_ttft_p99_ms: Mapping[tuple[Tier, str], float] = field(default_factory=dict)
    tls: TlsConfig | None = None
    jwt: JwtConfig | None = None
    tier_limits: Mapping[Tier, Limits] = field(default_factory=dict)  # for JWT callers
    shadow: ShadowConfig | None = None
    decision_log: DecisionLogConfig | None = None
    latency_models: Mapping[str, LatencyFit] = field(default_factory=dict)  # pool -> fit
    source: str = "<memory>"

    def slo_ms(self, tier: Tier, bucket: str) -> float | None:
        return self.slo_ttft_p99_ms.get((tier, bucket), self.slo_ttft_p99_ms.get((tier, "*")))

    # Token counts where one token more or less changes a decision (bucket edges, pool
    # rules, the model max): near these the exact tokenizer is worth its cost.
    decision_thresholds: tuple[int, ...] = ()
    # Per path prefix: what Envoy does when the sidecar is unreachable there (e.g. health
    # checks open while inference stays closed). Longest prefix first in the routes.
    failure_mode_by_path: Mapping[str, FailureMode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        points: set[int] = {self.max_context_tokens}
        points.update(b.max_tokens for b in self.buckets if b.max_tokens is not None)
        for rule in self.route_rules:
            points.add(rule.min_context_tokens)
            if rule.max_context_tokens is not None:
                points.add(rule.max_context_tokens)
        points.discard(0)
        # Derived once per policy, not per request; frozen, hence object.__setattr__.
        object.__setattr__(self, "decision_thresholds", tuple(sorted(points)))

    def key_for(self, api_key: str) -> ApiKey | None:
        return self.keys.get(hash_api_key(api_key))

    def bucket_for(self, context_tokens: int) -> ContextBucket:
        for bucket in self.buckets:
            if bucket.contains(context_tokens):
                return bucket
        return self.buckets[-1]  # unreachable: validation makes the buckets cover [0, inf)

    def pool_for(self, context_tokens: int) -> str:
        for rule in self.route_rules:
            if rule.matches(context_tokens):
                return rule.pool
        return self.default_pool


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


# --- strict reading -------------------------------------------------------------------------


class _Section:
    """Reads one mapping; `close()` rejects every key that nobody asked for."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, dict):
            raise PolicyError(f"{path or '<root>'}: expected a mapping, got {_kind(raw)}")
        self._raw: dict[str, Any] = raw
        self._path = path
        self._seen: set[str] = set()

    def child(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def get(self, name: str, kind: type[T], default: T) -> T:
        self._seen.add(name)
        if name not in self._raw or self._raw[name] is None:
            return default
        return _expect(self._raw[name], kind, self.child(name))

    def require(self, name: str, kind: type[T]) -> T:
        self._seen.add(name)
        if name not in self._raw:
            raise PolicyError(f"{self.child(name)}: required field is missing")
        return _expect(self._raw[name], kind, self.child(name))

    def section(self, name: str) -> _Section:
        self._seen.add(name)
        return _Section(self._raw.get(name) or {}, self.child(name))

    def raw(self, name: str) -> object:
        self._seen.add(name)
        return self._raw.get(name)

    def close(self) -> None:
        unknown = sorted(set(self._raw) - self._seen)
        if unknown:
            raise PolicyError(f"{self.child(str(unknown[0]))}: unknown field")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _expect(value: object, kind: type[T], path: str) -> T:
    # bool is an int subclass in Python; a YAML `true` must not pass as a number.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise PolicyError(f"{path}: expected {kind.__name__}, got {_kind(value)}")
    return value


def _positive(value: int | float, path: str) -> None:
    if value <= 0:
        raise PolicyError(f"{path}: must be > 0, got {value}")


_DEFAULT_BUCKETS: tuple[tuple[str, int | None, float, float], ...] = (
    # Cost weights follow the field's latency slopes: a long request costs more per token;
    # KV weights its memory per token (1x / 1.8x / 4.2x, +15% for long sessions).
    ("0-4k", 4096, 1.0, 1.0),
    ("4-8k", 8192, 1.3, 1.8),
    ("8-32k", 32768, 1.8, 4.2),
    ("32k-128k", 131072, 2.5, 4.83),
    ("128k+", None, 3.0, 4.83),
)
_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def parse_policy(raw: object, source: str = "<memory>") -> Policy:
    root = _Section(raw, "")
    root.get("version", int, 1)

    model = root.section("model")
    model_name = model.get("name", str, "deepseek-v4")
    fallback_model = model.get("fallback_model", str, "") or None
    max_context = model.get("max_context_tokens", int, 131072)
    _positive(max_context, model.child("max_context_tokens"))
    default_max_tokens = model.get("default_max_tokens", int, 1024)
    _positive(default_max_tokens, model.child("default_max_tokens"))
    model.close()

    request = root.section("request")
    max_body_bytes = request.get("max_body_bytes", int, 16 * 1024 * 1024)
    _positive(max_body_bytes, request.child("max_body_bytes"))
    message_timeout_ms = request.get("message_timeout_ms", int, 1000)
    _positive(message_timeout_ms, request.child("message_timeout_ms"))
    upstream_timeout_s = request.get("upstream_timeout_s", float, 600.0)
    _positive(upstream_timeout_s, request.child("upstream_timeout_s"))
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

    estimation = root.section("estimation")
    exact_margin = estimation.get("exact_margin", float, 0.15)
    if not 0.0 <= exact_margin < 1.0:
        raise PolicyError(f"{estimation.child('exact_margin')}: must be in [0, 1)")
    exact_max_bytes = estimation.get("exact_max_bytes", int, 256 * 1024)
    overhead = estimation.get("per_message_overhead_tokens", int, 4)
    if overhead < 0:
        raise PolicyError(f"{estimation.child('per_message_overhead_tokens')}: must be >= 0")
    estimation.close()

    buckets = _parse_buckets(root.raw("buckets"), root.child("buckets"))
    pools = _parse_pools(root.raw("pools"), root.child("pools"))

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
    route_rules = _parse_rules(rules_raw, routing.child("rules"), pools)
    routing.close()

    budget = _parse_budget(root.section("budget"))
    tls = _parse_tls(root.raw("tls"), root.child("tls"))
    shadow = _parse_shadow(root.raw("shadow"), root.child("shadow"), pools)
    decision_log = _parse_decision_log(root.raw("decision_log"), root.child("decision_log"))
    latency_models = _parse_latency_models(
        root.raw("latency_model"), root.child("latency_model"), pools, buckets
    )
    jwt = _parse_jwt(root.raw("jwt"), root.child("jwt"))
    breaker = _parse_breaker(root.section("breaker"))
    bucket_names = {b.name for b in buckets}
    slos = _parse_slos(root.section("slos"), bucket_names)
    fallback_pool = routing_fallback

    tier_limits = _parse_tiers(root.section("tiers"))
    keys = _parse_keys(root.raw("keys"), root.child("keys"), tier_limits)
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
        exact_margin=exact_margin,
        exact_max_bytes=exact_max_bytes,
        per_message_overhead_tokens=overhead,
        buckets=buckets,
        pools=pools,
        default_pool=default_pool,
        route_rules=route_rules,
        keys=keys,
        budget=budget,
        breaker=breaker,
        fallback_pool=fallback_pool,
        fallback_model=fallback_model,
        slo_ttft_p99_ms=slos,
        tls=tls,
        jwt=jwt,
        tier_limits=tier_limits,
        shadow=shadow,
        decision_log=decision_log,
        latency_models=latency_models,
        source=source,
    )


def _parse_buckets(raw: object, path: str) -> tuple[ContextBucket, ...]:
    if raw is None:
        raw = [
            {"name": n, "max_tokens": m, "cost_weight": w, "kv_weight": kv}
            for n, m, w, kv in _DEFAULT_BUCKETS
        ]
    if not isinstance(raw, list) or not raw:
        raise PolicyError(f"{path}: expected a non-empty list of buckets")
    buckets: list[ContextBucket] = []
    lower = 0
    for i, item in enumerate(raw):
        sec = _Section(item, f"{path}[{i}]")
        name = sec.require("name", str)
        upper_raw = sec.raw("max_tokens")
        upper = None if upper_raw is None else _expect(upper_raw, int, sec.child("max_tokens"))
        weight = sec.get("cost_weight", float, 1.0)
        _positive(weight, sec.child("cost_weight"))
        kv_weight = sec.get("kv_weight", float, 1.0)
        _positive(kv_weight, sec.child("kv_weight"))
        sec.close()
        if upper is not None and upper < lower:
            raise PolicyError(f"{sec.child('max_tokens')}: buckets must be in ascending order")
        if upper is None and i != len(raw) - 1:
            raise PolicyError(f"{sec.child('max_tokens')}: only the last bucket may be unbounded")
        buckets.append(ContextBucket(name, lower, upper, weight, kv_weight))
        lower = (upper or 0) + 1
    if buckets[-1].max_tokens is not None:
        raise PolicyError(f"{path}[{len(raw) - 1}].max_tokens: the last bucket must be unbounded")
    if len({b.name for b in buckets}) != len(buckets):
        raise PolicyError(f"{path}: bucket names must be unique")
    return tuple(buckets)


def _parse_pools(raw: object, path: str) -> dict[str, Pool]:
    if raw is None:
        raw = {
            "default": {"endpoints": ["127.0.0.1:18001"]},
            "long": {"endpoints": ["127.0.0.1:18002"]},
            "fallback": {"endpoints": ["127.0.0.1:18003"]},
        }
    if not isinstance(raw, dict) or not raw:
        raise PolicyError(f"{path}: expected a non-empty mapping of pool name -> pool")
    pools: dict[str, Pool] = {}
    for name, item in raw.items():
        pool_path = f"{path}.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            raise PolicyError(f"{pool_path}: pool names are lowercase [a-z0-9_-], max 32 chars")
        sec = _Section(item, pool_path)
        endpoints_raw = sec.require("endpoints", list)
        capacities: dict[str, int | None] = {}
        for field_name in ("kv_capacity_tokens", "max_num_seqs"):
            value = sec.raw(field_name)
            capacities[field_name] = (
                None if value is None else _expect(value, int, sec.child(field_name))
            )
            if value is not None:
                _positive(capacities[field_name] or 0, sec.child(field_name))
        sec.close()
        if not endpoints_raw:
            raise PolicyError(f"{sec.child('endpoints')}: needs at least one endpoint")
        endpoints = []
        for j, ep in enumerate(endpoints_raw):
            ep_path = f"{sec.child('endpoints')}[{j}]"
            match = _ENDPOINT.match(ep) if isinstance(ep, str) else None
            if match is None or not 0 < int(match["port"]) < 65536:
                raise PolicyError(f"{ep_path}: expected 'host:port', got {ep!r}")
            endpoints.append((match["host"].strip("[]"), int(match["port"])))
        pools[name] = Pool(name, tuple(endpoints), **capacities)
    return pools


def _parse_rules(raw: object, path: str, pools: Mapping[str, Pool]) -> tuple[RouteRule, ...]:
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected a list of rules")
    rules = []
    for i, item in enumerate(raw):
        sec = _Section(item, f"{path}[{i}]")
        pool = sec.require("pool", str)
        if pool not in pools:
            raise PolicyError(f"{sec.child('pool')}: no pool named {pool!r}")
        low = sec.get("min_context_tokens", int, 0)
        high_raw = sec.raw("max_context_tokens")
        high = None if high_raw is None else _expect(high_raw, int, sec.child("max_context_tokens"))
        sec.close()
        if low < 0 or (high is not None and high < low):
            raise PolicyError(f"{sec.child('min_context_tokens')}: empty or negative range")
        rules.append(RouteRule(pool, low, high))
    return tuple(rules)


_LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_hour",
    "concurrent_requests",
    "max_context_tokens",
)


def _parse_limits(sec: _Section, base: Limits) -> Limits:
    values: dict[str, int | None] = {}
    for name in _LIMIT_FIELDS:
        value = sec.get(name, int, -1)
        if value == -1:
            values[name] = getattr(base, name)
            continue
        if value < 0:
            raise PolicyError(f"{sec.child(name)}: must be >= 0")
        values[name] = value
    sec.close()
    return Limits(**values)


def _parse_tiers(sec: _Section) -> dict[Tier, Limits]:
    limits = {}
    for tier in Tier:
        limits[tier] = _parse_limits(sec.section(tier.value), Limits())
    sec.close()
    return limits


_DEFAULT_BUDGET = BudgetConfig()


def _parse_shadow(raw: object, path: str, pools: Mapping[str, Pool]) -> ShadowConfig | None:
    if raw is None:
        return None
    sec = _Section(raw, path)
    pool = sec.require("pool", str)
    if pool not in pools:
        raise PolicyError(f"{sec.child('pool')}: no pool named {pool!r}")
    fraction = sec.get("fraction", float, 0.01)
    if not 0.0 <= fraction <= 1.0:
        raise PolicyError(f"{sec.child('fraction')}: must be in [0, 1]")
    sec.close()
    return ShadowConfig(pool, fraction)


def _parse_decision_log(raw: object, path: str) -> DecisionLogConfig | None:
    if raw is None:
        return None
    sec = _Section(raw, path)
    config = DecisionLogConfig(
        directory=sec.require("dir", str),
        sample_rate=sec.get("sample_rate", float, 0.01),
        keep_days=sec.get("keep_days", int, 7),
    )
    if not 0.0 <= config.sample_rate <= 1.0:
        raise PolicyError(f"{sec.child('sample_rate')}: must be in [0, 1]")
    _positive(config.keep_days, sec.child("keep_days"))
    sec.close()
    return config


def _parse_tls(raw: object, path: str) -> TlsConfig | None:
    if raw is None:
        return None
    sec = _Section(raw, path)
    config = TlsConfig(sec.require("cert_file", str), sec.require("key_file", str))
    sec.close()
    return config


def _parse_jwt(raw: object, path: str) -> JwtConfig | None:
    if raw is None:
        return None
    sec = _Section(raw, path)
    issuer = sec.require("issuer", str)
    audiences_raw = sec.get("audiences", list, [])
    audiences = tuple(
        _expect(a, str, f"{sec.child('audiences')}[{i}]") for i, a in enumerate(audiences_raw)
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


_DEFAULT_THRESHOLDS = BreakerThresholds()
_DEFAULT_SLOS_MS = {Tier.CRITICAL: 2000.0, Tier.STANDARD: 4000.0, Tier.SHEDDABLE: 15000.0}


def _parse_breaker(sec: _Section) -> BreakerConfig:
    t = _DEFAULT_THRESHOLDS
    th = sec.section("thresholds")
    values: dict[str, float] = {}
    for name in (
        "l1_p99_over_slo",
        "l2_p99_over_slo",
        "l3_p99_over_slo",
        "l1_kv_cache",
        "l2_error_rate",
        "l3_error_rate",
        "l2_gpu_memory",
        "l3_gpu_memory",
        "cooldown_s",
        "probe_hold_s",
        "probe_fraction",
    ):
        values[name] = th.get(name, float, getattr(t, name))
        if values[name] < 0:
            raise PolicyError(f"{th.child(name)}: must be >= 0")
    hold_raw = th.raw("enter_hold_s")
    hold = t.enter_hold_s
    if hold_raw is not None:
        if not isinstance(hold_raw, list) or len(hold_raw) != 3:
            raise PolicyError(f"{th.child('enter_hold_s')}: expected [L1, L2, L3] seconds")
        path = th.child("enter_hold_s")
        l1, l2, l3 = (_expect(v, float, f"{path}[{i}]") for i, v in enumerate(hold_raw))
        hold = (l1, l2, l3)
    th.close()
    if not 0.0 <= values["probe_fraction"] <= 1.0:
        raise PolicyError(f"{th.child('probe_fraction')}: must be in [0, 1]")
    config = BreakerConfig(
        thresholds=BreakerThresholds(enter_hold_s=hold, **values),
        window_s=sec.get("window_s", float, 60.0),
        min_samples=sec.get("min_samples", int, 20),
        evaluate_interval_s=sec.get("evaluate_interval_s", float, 1.0),
        scrape_metrics=sec.get("scrape_metrics", bool, True),
        scrape_interval_s=sec.get("scrape_interval_s", float, 5.0),
        stale_after_s=sec.get("stale_after_s", float, 15.0),
        controller_enabled=sec.get("controller_enabled", bool, True),
        controller_key_budgets=sec.get("controller_key_budgets", bool, False),
        controller_interval_s=sec.get("controller_interval_s", float, 5.0),
        latency_weight=sec.get("latency_weight", float, 0.7),
        kv_weight=sec.get("kv_weight", float, 0.3),
        kv_shares=_parse_kv_shares(sec.section("kv_shares")),
    )
    for name in (
        "window_s",
        "evaluate_interval_s",
        "scrape_interval_s",
        "stale_after_s",
        "controller_interval_s",
    ):
        _positive(getattr(config, name), sec.child(name))
    if config.scrape_interval_s > 15.0:
        raise PolicyError(f"{sec.child('scrape_interval_s')}: at most 15 s")
    sec.close()
    return config


def _parse_latency_models(
    raw: object, path: str, pools: Mapping[str, Pool], buckets: Sequence[ContextBucket]
) -> dict[str, LatencyFit]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected pool name -> latency model")
    names = {b.name for b in buckets}
    fits: dict[str, LatencyFit] = {}
    for pool, item in raw.items():
        sec = _Section(item, f"{path}.{pool}")
        if pool not in pools:
            raise PolicyError(f"{path}.{pool}: no pool named {pool!r}")
        base = sec.require("base_latency_ms", float)
        prefill = sec.require("prefill_ms_per_1k_tokens", float)
        slopes_raw = sec.get("bucket_slopes", dict, {})
        sec.close()
        for name, value in (("base_latency_ms", base), ("prefill_ms_per_1k_tokens", prefill)):
            if value < 0:
                raise PolicyError(f"{sec.child(name)}: must be >= 0")
        slopes: dict[str, float] = {}
        for name, value in slopes_raw.items():
            where = f"{sec.child('bucket_slopes')}.{name}"
            if name not in names:
                raise PolicyError(f"{where}: no bucket named {name!r}")
            slopes[name] = _expect(value, float, where)
            _positive(slopes[name], where)
        fits[pool] = LatencyFit(base, prefill, slopes)
    return fits


def _parse_kv_shares(sec: _Section) -> dict[Tier, float]:
    shares = dict(BreakerConfig().kv_shares)
    for tier in Tier:
        value = sec.get(tier.value, float, shares[tier])
        if not 0.0 < value <= 1.0:
            raise PolicyError(f"{sec.child(tier.value)}: a share of the KV cache, in (0, 1]")
        shares[tier] = value
    sec.close()
    if not shares[Tier.SHEDDABLE] <= shares[Tier.STANDARD] <= shares[Tier.CRITICAL]:
        raise PolicyError(f"{sec.child('sheddable')}: shares must not grow from critical down")
    return shares


def _parse_slos(sec: _Section, bucket_names: set[str]) -> dict[tuple[Tier, str], float]:
    slos: dict[tuple[Tier, str], float] = {(t, "*"): ms for t, ms in _DEFAULT_SLOS_MS.items()}
    for tier in Tier:
        tier_sec = sec.section(tier.value)
        for name in list(tier_sec._raw):
            if name != "default" and name not in bucket_names:
                raise PolicyError(f"{tier_sec.child(name)}: no bucket named {name!r}")
            value = tier_sec.get(name, float, 0.0)
            _positive(value, tier_sec.child(name))
            slos[(tier, "*" if name == "default" else name)] = value
        tier_sec.close()
    sec.close()
    return slos


def _parse_budget(sec: _Section) -> BudgetConfig:
    store_raw = sec.get("store", str, BudgetStoreKind.MEMORY.value)
    try:
        store = BudgetStoreKind(store_raw)
    except ValueError:
        raise PolicyError(f"{sec.child('store')}: expected 'memory' or 'redis'") from None
    config = BudgetConfig(
        store=store,
        redis_url=sec.get("redis_url", str, _DEFAULT_BUDGET.redis_url),
        redis_cluster=sec.get("redis_cluster", bool, False),
        redis_timeout_ms=sec.get("redis_timeout_ms", float, _DEFAULT_BUDGET.redis_timeout_ms),
        replicas=sec.get("replicas", int, 1),
    )
    if not config.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise PolicyError(f"{sec.child('redis_url')}: expected redis://, rediss:// or unix://")
    _positive(config.redis_timeout_ms, sec.child("redis_timeout_ms"))
    _positive(config.replicas, sec.child("replicas"))
    sec.close()
    return config


def _parse_keys(raw: object, path: str, tier_limits: Mapping[Tier, Limits]) -> dict[str, ApiKey]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected a list of keys")
    keys: dict[str, ApiKey] = {}
    for i, item in enumerate(raw):
        sec = _Section(item, f"{path}[{i}]")
        clear = sec.raw("key")
        hashed = sec.raw("key_sha256")
        if (clear is None) == (hashed is None):
            raise PolicyError(f"{path}[{i}]: exactly one of 'key' or 'key_sha256' is required")
        if clear is not None:
            digest = hash_api_key(_expect(clear, str, sec.child("key")))
        else:
            digest = _expect(hashed, str, sec.child("key_sha256")).lower()
            if not _SHA256.match(digest):
                raise PolicyError(f"{sec.child('key_sha256')}: expected 64 hex characters")
        tenant = sec.require("tenant", str)
        tier_raw = sec.get("tier", str, Tier.STANDARD.value)
        try:
            tier = Tier(tier_raw)
        except ValueError:
            allowed = ", ".join(t.value for t in Tier)
            raise PolicyError(f"{sec.child('tier')}: expected one of {allowed}") from None
        limits = _parse_limits(sec.section("limits"), tier_limits[tier])
        sec.close()
        if digest in keys:
            raise PolicyError(f"{path}[{i}]: duplicate API key")
        keys[digest] = ApiKey(digest, tenant, tier, limits)
    return keys


def load_policy(path: str | Path) -> Policy:
    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"<root>: not valid YAML: {exc}") from None
    return parse_policy(raw if raw is not None else {}, source=str(path))
