"""The small domain types every part of slogate speaks: tiers, keys, limits, buckets, pools,
tenants.

What lives here: frozen value types, the one hash that names an API key, the one rule
that makes a caller (`build_caller`: its tier, limits and budget, whoever vouched for it)
and the one range of context lengths that buckets and route rules cover (`within`).
Nothing here imports any other slogate module, reads a file or knows about Envoy, Redis or
gRPC: this is the bottom layer (see the import contracts in pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class BudgetScope(StrEnum):
    """Where a tenant's limits and spend budget count (the `regions:` section)."""

    REGION = "region"  # each region enforces them on its own (one region: as always)
    GLOBAL = "global"  # one budget worldwide, spent by each region from its lease


class Tier(StrEnum):
    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"


def tier_objective(tier: Tier) -> str:
    """The InferenceObjective slogate names a tier's requests by (to an endpoint picker
    behind it, and the ones `slogate k8s` renders): slogate-critical, slogate-standard, ..."""
    return f"slogate-{tier.value}"


class FailureMode(StrEnum):
    CLOSED = "closed"  # sidecar unreachable -> Envoy refuses the request
    OPEN = "open"  # sidecar unreachable -> Envoy forwards the request unchecked


class EngineKind(StrEnum):
    """What serves a pool, so its /metrics are read with the right names."""

    VLLM = "vllm"
    SGLANG = "sglang"


class Picker(StrEnum):
    """Who picks the engine inside a pool for each request."""

    SLOGATE = "slogate"  # slogate scores the engines (prefix, load, length) and names one
    ENVOY = "envoy"  # Envoy's own round robin over the healthy engines
    # An endpoint picker of the operator's (llm-d's, an InferencePool's) picks: slogate names
    # no engine and passes the objective and fairness headers on.
    EXTERNAL = "external"


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # weighted tokens
    tokens_per_hour: int | None = None  # raw tokens (prompt + completion)
    concurrent_requests: int | None = None
    max_context_tokens: int | None = None

    def capacity(self, bucket: str) -> int | None:
        # The field by name, not a dict of all three built per call: the budget ledger asks
        # a dozen times per request.
        limit: int | None = getattr(self, _CAPACITY_FIELDS[bucket])
        return limit


# The limit each budget bucket (budget.ledger) draws against.
_CAPACITY_FIELDS = {
    "requests": "requests_per_minute",
    "tokens": "tokens_per_minute",
    "hour": "tokens_per_hour",
}


# Every field of Limits, in the order the policy documents them.
LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_hour",
    "concurrent_requests",
    "max_context_tokens",
)


def within(context_tokens: int, min_tokens: int, max_tokens: int | None) -> bool:
    """In [min_tokens, max_tokens], both inclusive; `max_tokens` None: no upper bound (the
    range a context bucket or a route rule covers)."""
    return context_tokens >= min_tokens and (max_tokens is None or context_tokens <= max_tokens)


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
        return within(context_tokens, self.min_tokens, self.max_tokens)


class ChatTemplate(StrEnum):
    """The chat template the engines render a chat with, to build the token ids they hash."""

    DEEPSEEK = "deepseek"  # DeepSeek V3/R1's: begin-of-sentence, User and Assistant markers
    CHATML = "chatml"  # <|im_start|>role\n...<|im_end|>\n (Qwen; the tiny test model)


@dataclass(frozen=True, slots=True)
class KvEvents:
    """A pool's engines publish their KV cache events (vLLM `--kv-events-config`): slogate
    subscribes to each engine it discovers and scores prefixes from what they hold
    (engines.cached_blocks). Off where absent."""

    port: int = 5557  # the PUB socket's port on every engine (vLLM's `endpoint`)
    replay_port: int | None = None  # its ROUTER replay socket (`replay_endpoint`); None: none
    # port and replay_port are added to each engine's HTTP port (several engines on one host)
    relative_ports: bool = False
    topic: str = ""  # vLLM's `topic`
    # Blocks kept per engine (~130 bytes each, engines.cached_blocks): at least the engine's
    # KV blocks, so that nothing it holds is evicted here.
    max_blocks: int = 262_144
    # The engine's tokenizer.json (None: slogate's own DeepSeek one, the counter's) and chat
    # template: the request path renders a chat into the ids the engine hashes.
    tokenizer: str | None = None
    chat_template: ChatTemplate = ChatTemplate.DEEPSEEK

    def ports(self, engine_port: int) -> tuple[int, int | None]:
        """The (PUB, replay) ports of the engine serving HTTP on `engine_port`."""
        if not self.relative_ports:
            return self.port, self.replay_port
        replay = None if self.replay_port is None else engine_port + self.replay_port
        return engine_port + self.port, replay


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    # The pool's engines: addresses, or DNS names whose every A record is an engine.
    endpoints: tuple[tuple[str, int], ...]
    # The pool's KV cache in tokens and its batch slots (vLLM max_num_seqs), all engines
    # together (an engine that reports its own KV size in its metrics counts with that).
    # Set: requests are admitted against what is in flight (breaker.kv_shares per tier),
    # and only the serving engines' part counts. None: not limited.
    kv_capacity_tokens: int | None = None
    max_num_seqs: int | None = None
    # The engines run vLLM's priority scheduling (`--scheduling-policy priority`): slogate
    # writes each request's `priority` from its tier (lower runs first).
    priority_scheduling: bool = False
    # The engines' metric names: vLLM's (`vllm:*`) or SGLang's (`sglang:*`).
    engine: EngineKind = EngineKind.VLLM
    # Who picks the engine of each request among `endpoints` (every address a hostname
    # resolves to is an engine: a Kubernetes headless Service names all of them).
    picker: Picker = Picker.SLOGATE
    # Each engine's availability zone ("host:port" -> zone), for `slogate preflight`'s
    # cross-zone latency check; the sidecar does not read it. A tuple of pairs, not a dict:
    # the pool stays hashable.
    zones: tuple[tuple[str, str], ...] = ()
    # The engines publish KV events (None: they do not, or slogate does not listen).
    kv_events: KvEvents | None = None

    def zone_of(self, endpoint: str) -> str | None:
        """The zone the policy gives the engine at "host:port", or None."""
        return dict(self.zones).get(endpoint)


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """A pool's measured latency model (`slogate calibrate`): what the simulator plays."""

    base_latency_ms: float  # TTFT of a tiny request at empty load, network excluded
    prefill_ms_per_1k_tokens: float  # in the first context bucket
    bucket_slopes: Mapping[str, float]  # bucket name -> prefill cost relative to the first

    def expected_ttft_ms(self, prompt_tokens: int, bucket: str) -> float:
        """TTFT of a prompt at empty load: the base plus its prefill at its bucket's slope."""
        slope = self.bucket_slopes.get(bucket, 1.0)
        return self.base_latency_ms + prompt_tokens / 1000 * self.prefill_ms_per_1k_tokens * slope


@dataclass(frozen=True, slots=True)
class RouteRule:
    """Send requests whose context lies in [min, max] tokens to `pool`."""

    pool: str
    min_context_tokens: int
    max_context_tokens: int | None

    def matches(self, context_tokens: int) -> bool:
        return within(context_tokens, self.min_context_tokens, self.max_context_tokens)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as the policy knows it: only its SHA-256 is kept in memory."""

    key_sha256: str
    tenant: str
    tier: Tier
    limits: Limits = field(default_factory=Limits)  # tier defaults + this key's overrides
    from_jwt: bool = False  # a JWT caller: tenant named by a claim, not by the policy
    # Draws on its tenant's one budget (`tenants: ... shared_limits: true`), not its own.
    shared_budget: bool = False
    # Its tenant's InferenceObjective (`tenants: ... inference_objective:`), what an endpoint
    # picker behind slogate is told it is; None: its tier's objective.
    inference_objective: str | None = None

    @property
    def objective(self) -> str:
        """The InferenceObjective its requests name: its tenant's, else its tier's."""
        return self.inference_objective or tier_objective(self.tier)

    @property
    def tenant_label(self) -> str:
        """The tenant as a metric label, a JWT caller's as its claim names it: the metrics
        bound how many there are (`telemetry.tenant_series_max`, the rest `other`:
        extproc.service.tenant_series)."""
        return self.tenant

    @property
    def key_id(self) -> str:
        """Short, non-reversible name for logs and admin views; never the key itself."""
        return self.key_sha256[:12]

    @property
    def budget_id(self) -> str:
        """Whose windows (requests, tokens per minute and hour, concurrency) a request
        draws on: the key's own, or its tenant's one budget shared by all its keys."""
        return f"tenant:{self.tenant}" if self.shared_budget else self.key_id


class SpendUnit(StrEnum):
    """What a tenant's spend budget counts: token-equivalents, or US dollars."""

    TOKENS = "tokens"
    USD = "usd"


# The token kinds a spend budget prices, in the order usage reports them.
TOKEN_KINDS = ("prompt", "cached_prompt", "completion", "reasoning")


@dataclass(frozen=True, slots=True)
class SpendLimits:
    """A tenant's spend budget per calendar day and month (UTC), in `unit`; None: no
    budget for that window. All its keys (and JWT callers naming it) share it."""

    unit: SpendUnit = SpendUnit.TOKENS
    per_day: float | None = None
    per_month: float | None = None

    def windows(self) -> dict[str, float]:
        """'day' / 'month' -> its limit, for the windows set."""
        named = {"day": self.per_day, "month": self.per_month}
        return {name: limit for name, limit in named.items() if limit is not None}


@dataclass(frozen=True, slots=True)
class SpendPrices:
    """What one token of each kind (TOKEN_KINDS) costs: in token-equivalents for budgets in
    tokens (`tokens`, default 1 each), in US dollars per million tokens for budgets in usd
    (`usd_per_million`; None: no budget may be in usd)."""

    tokens: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS, 1.0))
    usd_per_million: Mapping[str, float] | None = None

    def per_token(self, unit: SpendUnit) -> Mapping[str, float]:
        """Each kind's cost of one token in `unit`."""
        if unit is SpendUnit.TOKENS:
            return self.tokens
        usd = self.usd_per_million or {}
        return {kind: price / 1e6 for kind, price in usd.items()}


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as the policy's `tenants:` section sets it, its class folded in: what each of
    its keys (and each JWT caller naming it) inherits. A key's own tier and limits still win
    over these, and these over its tier's."""

    tier: Tier = Tier.STANDARD
    limits: Mapping[str, int] = field(default_factory=dict)  # the `Limits` fields it sets
    # P99 TTFT objective in ms per bucket name ("*": any bucket); empty: its tier's SLOs.
    ttft_p99_ms: Mapping[str, float] = field(default_factory=dict)
    tpot_p99_ms: float | None = None  # ms per output token; None: its tier's
    weight: float = 1.0  # its share in the waiting room's fair order
    pools: frozenset[str] | None = None  # the pools its requests may be routed to; None: all
    suspended: bool = False  # every request refused (403); those in flight finish
    tenant_class: str | None = None  # the class it named, if any
    spend: SpendLimits | None = None  # its spend budget per day / month; None: none
    # Its limits are one budget for all its keys (and JWT callers naming it) instead of
    # each key's own; a key that sets limits of its own keeps its own budget.
    shared_limits: bool = False
    # The InferenceObjective (Gateway API inference extension) its requests name to an
    # endpoint picker; its priority is its tier's. None: its tier's objective.
    inference_objective: str | None = None
    # Where its limits and spend budget count: per region, or one budget worldwide.
    scope: BudgetScope = BudgetScope.REGION

    def limits_over(self, base: Limits) -> Limits:
        """`base` (its tier's limits) with the fields this tenant sets replaced."""
        return dataclasses.replace(base, **self.limits) if self.limits else base

    def ttft_ms(self, bucket: str) -> float | None:
        """Its own TTFT objective for `bucket`; None: its tier's applies."""
        slos = self.ttft_p99_ms
        return slos.get(bucket, slos.get("*")) if slos else None


@dataclass(frozen=True, slots=True)
class TenantBook:
    """Every tenant the policy names, and what a tenant it does not name gets (`default`;
    None: such a tenant has no settings of its own: its keys' tier and limits as given)."""

    listed: Mapping[str, Tenant] = field(default_factory=dict)
    default: Tenant | None = None
    # What each token kind costs against a spend budget (`tenants.prices`).
    prices: SpendPrices = field(default_factory=SpendPrices)
    # The longest TTFT objective any tenant sets (the waiting room's longest wait is derived
    # from it); computed once, not per request.
    longest_ttft_ms: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        entries = [*self.listed.values(), *([self.default] if self.default else [])]
        longest = max((ms for t in entries for ms in t.ttft_p99_ms.values()), default=None)
        object.__setattr__(self, "longest_ttft_ms", longest)

    def get(self, name: str) -> Tenant | None:
        return self.listed.get(name, self.default)


def build_caller(
    key_sha256: str,
    tenant: str,
    tier: Tier | None,
    own_limits: Mapping[str, int],
    tier_limits: Mapping[Tier, Limits],
    tenants: TenantBook | None,
    from_jwt: bool = False,
) -> ApiKey:
    """The one rule that makes a caller, for a policy key, a stored key and a JWT's claims.

    Most specific wins: the tier given (a key's own, a token's tier claim), else its tenant's
    (`tenants:`), else standard. Limits field by field: `own_limits` (the fields the key
    sets) over its tenant's over its tier's; a tier the policy sets no limits for is
    unlimited, as a `tiers:` section that leaves it out reads (every field None), never an
    error. A caller draws on its tenant's one budget when the tenant says `shared_limits`
    and the caller sets no limit of its own (`limits: {}` sets none). Its inference
    objective is its tenant's where the caller is of its tenant's tier."""
    entry = tenants.get(tenant) if tenants is not None else None
    if tier is None:
        tier = entry.tier if entry is not None else Tier.STANDARD
    limits = tier_limits.get(tier, Limits())
    if entry is not None:
        limits = entry.limits_over(limits)
    if own_limits:
        limits = dataclasses.replace(limits, **own_limits)
    shared = entry is not None and entry.shared_limits and not own_limits
    # The tenant's objective carries its tier's priority: a key of another tier (its own
    # `tier:`, a token's tier claim) names its tier's objective instead.
    objective = None
    if entry is not None and entry.tier is tier:
        objective = entry.inference_objective
    return ApiKey(
        key_sha256,
        tenant,
        tier,
        limits,
        from_jwt=from_jwt,
        shared_budget=shared,
        inference_objective=objective,
    )


class TenantWeights(Mapping[str, float]):
    """The waiting room's fair-share weights: the tenants named, and `default` for every
    other one (a total mapping: `get(tenant, 1.0)` answers `default` for a tenant not named)."""

    __slots__ = ("_default", "_named")

    def __init__(self, named: Mapping[str, float], default: float = 1.0) -> None:
        self._named = dict(named)
        self._default = default

    def __getitem__(self, tenant: str) -> float:
        return self._named.get(tenant, self._default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._named)

    def __len__(self) -> int:
        return len(self._named)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TenantWeights):
            return (self._named, self._default) == (other._named, other._default)
        return isinstance(other, Mapping) and self._default == 1.0 and self._named == dict(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TenantWeights({self._named!r}, default={self._default})"


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()
