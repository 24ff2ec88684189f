"""The frozen policy the sidecar runs on: every section of the YAML file as a typed object.

What lives here: the configuration dataclasses (`Policy` and its sections) with their
defaults and the few derived lookups the request path needs (bucket, pool, SLO of a
request). Reading and validating the YAML is `policy.loader`'s job; nothing here does I/O.
Imports only `policy.domain` and `policy.apis`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from policy._ahead import AheadConfig
from policy._data_path import DataPathConfig
from policy._forecast import ForecastConfig
from policy._keystore import KeyStoreConfig
from policy._regions import RegionsConfig
from policy._telemetry import TelemetryConfig
from policy._traffic import TrafficRecordConfig
from policy.apis import KNOWN_APIS, PathTable
from policy.domain import (
    ApiKey,
    ContextBucket,
    FailureMode,
    LatencyFit,
    Limits,
    Pool,
    RouteRule,
    TenantBook,
    Tier,
    hash_api_key,
)


class BudgetStoreKind(StrEnum):
    MEMORY = "memory"  # in-process: one sidecar, nothing to run beside it
    REDIS = "redis"  # shared by every sidecar replica


class UnverifiedSpend(StrEnum):
    """What a request whose spend check did not answer in time (Redis slow or away) gets:
    `admit`, settled once Redis answers (admission.spend_step), or `refuse`, a 503."""

    ADMIT = "admit"
    REFUSE = "refuse"


# A spend check's default wait: a spend budget has no local share to fall back on, so it
# waits longer than a token budget (10 ms) to ride out what slows a healthy Redis (a fork
# for a snapshot or an AOF rewrite, ~10 ms per GB of data), a tenth of Envoy's default 1 s
# wait for each sidecar reply, and small beside a model's time to first token.
SPEND_TIMEOUT_MS = 100.0


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    store: BudgetStoreKind = BudgetStoreKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    redis_timeout_ms: float = 10.0  # past this a decision falls back to local budgets
    replicas: int = 1  # sidecars sharing the budgets; each keeps 1/replicas when degraded
    # A spend check's own wait on Redis (never shorter than redis_timeout_ms), and what a
    # request gets when it passes.
    spend_timeout_ms: float = SPEND_TIMEOUT_MS
    spend_unverified: UnverifiedSpend = UnverifiedSpend.ADMIT


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """Mirror a sampled share of routed inference requests to a shadow pool (Envoy)."""

    pool: str
    fraction: float  # 0..1


@dataclass(frozen=True, slots=True)
class CandidateConfig:
    """A second policy evaluated beside this one on every request, never enforced
    (`candidate: {file: ...}`; extproc.request.candidate). Its path as written: relative
    to the policy file's folder."""

    file: str


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
class BreakerThresholds:
    l1_p99_over_slo: float = 1.0
    l2_p99_over_slo: float = 1.5
    l3_p99_over_slo: float = 3.0
    l1_kv_cache: float = 0.85
    l2_error_rate: float = 0.01
    l3_error_rate: float = 0.10
    l2_gpu_memory: float = 0.90  # the emergency line
    l3_gpu_memory: float = 0.98  # OOM is near
    enter_hold_s: tuple[float, float, float] = (30.0, 30.0, 10.0)  # for L1, L2, L3
    cooldown_s: float = 60.0
    probe_hold_s: float = 30.0
    probe_fraction: float = 0.1


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    thresholds: BreakerThresholds = field(default_factory=BreakerThresholds)
    window_s: float = 60.0  # latency and error windows the breaker reads
    min_samples: int = 20  # fewer responses in the window: no latency / error signal
    evaluate_interval_s: float = 1.0
    scrape_metrics: bool = True  # scrape vLLM /metrics of every pool endpoint
    scrape_interval_s: float = 5.0
    stale_after_s: float = 15.0  # engine metrics older than this count as saturated
    # The dynamic quota controller (budget/quotas.py): tier multipliers on budgets.
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
    # How far a tier's share may grow while no tier above waits for room (budget.lending):
    # standard's into critical's reserve, sheddable's up to what standard may fill. At or
    # under a tier's own share: nothing is lent to it.
    kv_lend_up_to: float = 0.96


# The name of the breaker above every pool (metrics, drills, the admin API): no pool has it.
GLOBAL_BREAKER = "global"

DEFAULT_TPOT_SLOS_MS: Mapping[Tier, float] = {
    Tier.CRITICAL: 50.0,
    Tier.STANDARD: 100.0,
    Tier.SHEDDABLE: 200.0,
}


COUNTING_ENGINES = ("auto", "fastokens", "tiktoken")


@dataclass(frozen=True, slots=True)
class PickingConfig:
    """How slogate picks the engine of a request inside its pool (engines.scoring): a
    weighted sum of scores in [0, 1], each measurable alone (a weight of 0 turns it off)."""

    # The share of the prompt's leading token blocks an engine recently served (its prefix
    # cache may still hold them: a hit skips their prefill).
    prefix_weight: float = 2.0
    # How free the engine is: the KV and batch slots slogate holds on it, corrected by its
    # scraped KV usage and queue.
    load_weight: float = 1.0
    # The conversation's own engine by rendezvous hashing of its first blocks: every
    # replica computes the same one without talking to the others.
    affinity_weight: float = 1.0
    # Requests of one context bucket prefer the same engines (the field's "pack requests of
    # the same context length").
    length_weight: float = 0.25
    # Bounded load: an engine holding more than this x the pool's mean load keeps no
    # prefix or affinity pull (a popular prefix spills over instead of piling up).
    load_bound: float = 1.25
    block_tokens: int = 64  # prompt token ids are hashed in blocks of this many
    index_entries: int = 200_000  # prefix hashes remembered per pool (LRU): the memory bound
    # Engines named per request, best first: Envoy sends it to the first and retries a
    # connection refused before any byte on the second.
    choices: int = 2


@dataclass(frozen=True, slots=True)
class EngineHealthConfig:
    """When an engine stops getting new requests and when it gets them again."""

    # The sidecar probes the engines itself. False where it cannot reach them (only Envoy
    # may): an engine's state then comes from its answers alone, and Envoy's health checks.
    probes: bool = True
    probe_interval_s: float = 1.0  # GET /health on every engine (slogate's and Envoy's)
    probe_timeout_s: float = 1.0  # an answer later than this is a failed probe (a hung engine)
    unhealthy_after: int = 2  # failed probes in a row: dead
    healthy_after: int = 2  # answered probes in a row: serving again
    # Answers: this many 5xx or failed connections in a row take the engine out for
    # `eject_s` (doubling with each ejection in a row, up to 10x); Envoy ejects alike.
    eject_after_errors: int = 3
    eject_s: float = 10.0


@dataclass(frozen=True, slots=True)
class EnginesConfig:
    picking: PickingConfig = field(default_factory=PickingConfig)
    health: EngineHealthConfig = field(default_factory=EngineHealthConfig)
    # Every endpoint given as a DNS name (a headless Service) is resolved again this often;
    # each address it returns is an engine.
    discovery_interval_s: float = 10.0


@dataclass(frozen=True, slots=True)
class CountingConfig:
    """How prompts are counted (extproc.request.tokens.prompt): exactly, within these bounds."""

    per_message_overhead_tokens: int = 4  # the chat template around each message
    # Which BPE counts (extproc.request.tokens.native): fastokens, tiktoken (the same tokens,
    # 5-7x the CPU), or auto: fastokens where it is installed.
    engine: str = "auto"
    workers: int = 2  # threads counting text too long for the event loop
    # Uncounted text up to this is counted on the event loop, no hop to a worker thread:
    # mostly-ASCII text (at most one byte in ten beyond one per character; its worst
    # crafted 64 KiB held the loop ~1 ms on fastokens), and other text (random hanzi:
    # ~6.5 ms per 64 KiB) up to `inline_unicode_max_bytes`. The engine caps both: tiktoken
    # at 2 KiB (bench/results/overhead-levers-fastokens).
    inline_max_bytes: int = 65536
    inline_unicode_max_bytes: int = 4096
    # A text this long is cut and counted by all workers (tiktoken only: fastokens spreads a
    # long text over its own threads); 0: never.
    split_min_bytes: int = 32768
    max_bytes: int = 4 * 1024 * 1024  # larger prompts are not counted: the byte bound decides
    queue_max_bytes: int = 8 * 1024 * 1024  # waiting past this: the byte bound decides
    cache_entries: int = 65536  # message counts kept (chats resend their history)


@dataclass(frozen=True, slots=True)
class WaitingRoomConfig:
    """Requests refused only for capacity (a pool's KV cache or batch slots) wait here for
    room instead of getting a 503 at once (admission.waiting_room). Budgets and the breaker
    never wait: a budget is a contract, shedding is the breaker's answer to overload."""

    enabled: bool = True
    # The longest a request of each tier may wait; None (the default): `slo_share` of what
    # its TTFT SLO leaves after the prefill its pool's latency model expects (half the SLO
    # where the pool has no latency model), so that a request is not held past the point
    # where it can still meet its SLO. Critical may spend all of that on waiting; the lower
    # tiers a quarter: measured in the simulator, longer waits there served more requests
    # too late to count and cost goodput (bench/results/waiting-room-*.md).
    max_wait_s: Mapping[Tier, float | None] = field(
        default_factory=lambda: {Tier.CRITICAL: None, Tier.STANDARD: None, Tier.SHEDDABLE: None}
    )
    slo_share: Mapping[Tier, float] = field(
        default_factory=lambda: {Tier.CRITICAL: 1.0, Tier.STANDARD: 0.25, Tier.SHEDDABLE: 0.25}
    )
    min_wait_s: float = 0.2  # a derived critical wait is never shorter than this
    max_waiting: int = 1000  # waiting requests per pool and tier
    # Envoy holds every waiting body in memory: all of them together stay under this.
    max_waiting_bytes: int = 256 * 1024 * 1024
    # A blocked head-of-line request lets smaller ones that fit go first only while it has
    # waited less than this; then nothing passes it until it fits (no starvation).
    backfill_s: float = 0.5
    # ... and only while the pool is expected to free what the head lacks within this (at
    # the rate its requests gave room back over the last 10 s): the longest the pool is
    # held for one request. Holding longer cost more than it saved (bench/results/).
    hold_s: float = 0.5
    # Fair shares inside a tier: the tenant with the least recently attained service goes
    # first; service is weighted tokens (output x output_weight) decaying with this half-life.
    half_life_s: float = 60.0
    output_weight: float = 2.0
    tenant_weights: Mapping[str, float] = field(default_factory=dict)  # default 1.0 each
    # The alert fires when critical requests' P99 wait exceeds this (exported as a gauge).
    alert_critical_p99_wait_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Policy:
    model_name: str
    max_context_tokens: int
    default_max_tokens: int
    max_body_bytes: int
    message_timeout_ms: int
    upstream_timeout_s: float
    failure_mode: FailureMode
    buckets: tuple[ContextBucket, ...]
    pools: Mapping[str, Pool]
    default_pool: str
    route_rules: tuple[RouteRule, ...]
    keys: Mapping[str, ApiKey] = field(repr=False)
    counting: CountingConfig = field(default_factory=CountingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    breaker: BreakerConfig = field(default_factory=lambda: BreakerConfig())
    waiting_room: WaitingRoomConfig = field(default_factory=WaitingRoomConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    fallback_pool: str = "fallback"
    fallback_model: str | None = None  # None: keep the requested model at L3
    # P99 TTFT SLO in ms per (tier, bucket name); "*" is the tier's default for any bucket.
    slo_ttft_p99_ms: Mapping[tuple[Tier, str], float] = field(default_factory=dict)
    # P99 ms per output token per tier: a non-streamed request, whose first byte is its
    # whole answer, is held against the TTFT SLO + its output tokens x this.
    slo_tpot_p99_ms: Mapping[Tier, float] = field(default_factory=lambda: DEFAULT_TPOT_SLOS_MS)
    tls: TlsConfig | None = None
    jwt: JwtConfig | None = None
    tier_limits: Mapping[Tier, Limits] = field(default_factory=dict)  # for JWT callers
    # The `tenants:` section: what a tenant's keys inherit, its objectives, pools, suspension.
    tenants: TenantBook = field(default_factory=TenantBook, repr=False)
    shadow: ShadowConfig | None = None
    decision_log: DecisionLogConfig | None = None
    traffic_record: TrafficRecordConfig | None = None  # every decision's shape, for replay
    latency_models: Mapping[str, LatencyFit] = field(default_factory=dict)  # pool -> fit
    # Which paths reach a pool (default deny): public ones, the enabled APIs, extra ones.
    paths: PathTable = field(default_factory=lambda: PathTable.build(("/health",), KNOWN_APIS))
    # Completions one request may ask for at once (n, best_of, beam width); more: 400.
    max_sequences: int = 16
    source: str = "<memory>"
    # `key_store:` where keys managed without editing the policy live (policy.keyring).
    key_store: KeyStoreConfig = field(default_factory=KeyStoreConfig)
    # `candidate:` a policy evaluated beside this one, never enforced (policy.candidate).
    candidate: CandidateConfig | None = None
    # `telemetry:` tenant label bounds and OpenTelemetry tracing (policy._telemetry).
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    # `data_path:` one or two ext_proc messages, the Lua or native usage tap (policy._data_path).
    data_path: DataPathConfig = field(default_factory=DataPathConfig)
    # `forecast:` each tenant's seasonal demand forecast from the traffic record (policy._forecast).
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    # `ahead:` the business calendar and quotas moved before a ramp (policy._ahead); None:
    # the quota controller only reacts.
    ahead: AheadConfig | None = None
    # `regions:` the fleet's regions, the global ledger's leases, crossing (policy._regions);
    # absent: one region.
    regions: RegionsConfig = field(default_factory=RegionsConfig)

    def slo_ms(self, tier: Tier, bucket: str, tenant: str | None = None) -> float | None:
        """The P99 TTFT objective of a request: its tenant's where it sets one, else its
        tier's (for the bucket, else the tier's default)."""
        entry = None if tenant is None else self.tenants.get(tenant)
        if entry is not None and (own := entry.ttft_ms(bucket)) is not None:
            return own
        return self.slo_ttft_p99_ms.get((tier, bucket), self.slo_ttft_p99_ms.get((tier, "*")))

    def tpot_ms(self, tier: Tier, tenant: str | None = None) -> float | None:
        """The P99 ms per output token: its tenant's where it sets one, else its tier's."""
        entry = None if tenant is None else self.tenants.get(tenant)
        if entry is not None and entry.tpot_p99_ms is not None:
            return entry.tpot_p99_ms
        return self.slo_tpot_p99_ms.get(tier)

    def max_wait_s(
        self, tier: Tier, pool: str, bucket: str, prompt_tokens: int, tenant: str | None = None
    ) -> float:
        """How long a request may wait for capacity in the waiting room (0: not at all)."""
        room = self.waiting_room
        if not room.enabled:
            return 0.0
        configured = room.max_wait_s.get(tier)
        if configured is not None:
            return configured
        slo_ms = self.slo_ms(tier, bucket, tenant)
        if slo_ms is None:
            return room.min_wait_s
        fit = self.latency_models.get(pool)
        budget_ms = (
            slo_ms / 2 if fit is None else slo_ms - fit.expected_ttft_ms(prompt_tokens, bucket)
        )
        return max(room.min_wait_s, room.slo_share.get(tier, 1.0) * budget_ms / 1000)

    @property
    def longest_wait_s(self) -> float:
        """The longest any request may wait: what Envoy's message timeout must allow."""
        room = self.waiting_room
        if not room.enabled:
            return 0.0
        derived = max(
            (
                ms / 1000
                for (tier, _), ms in self.slo_ttft_p99_ms.items()
                if room.max_wait_s.get(tier) is None
            ),
            default=room.min_wait_s,
        )
        tenants_ms = self.tenants.longest_ttft_ms  # a tenant's own objective, in any tier
        if tenants_ms is not None and any(room.max_wait_s.get(t) is None for t in Tier):
            derived = max(derived, tenants_ms / 1000)
        return max(
            [derived, room.min_wait_s, *(w for w in room.max_wait_s.values() if w is not None)]
        )

    # Per path prefix: what Envoy does when the sidecar is unreachable there (e.g. health
    # checks open while inference stays closed). Longest prefix first in the routes.
    failure_mode_by_path: Mapping[str, FailureMode] = field(default_factory=dict)

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
