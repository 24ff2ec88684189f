from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Signals(_message.Message):
    __slots__ = ("p99_over_slo", "error_rate", "kv_cache_usage", "gpu_memory_usage", "queue_ratio")
    P99_OVER_SLO_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_USAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_RATIO_FIELD_NUMBER: _ClassVar[int]
    p99_over_slo: float
    error_rate: float
    kv_cache_usage: float
    gpu_memory_usage: float
    queue_ratio: float
    def __init__(self, p99_over_slo: _Optional[float] = ..., error_rate: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., gpu_memory_usage: _Optional[float] = ..., queue_ratio: _Optional[float] = ...) -> None: ...

class PoolAdmission(_message.Message):
    __slots__ = ("pool", "kv_tokens_held", "kv_tokens_capacity", "requests_held", "requests_capacity", "waiting", "oldest_wait_s")
    class WaitingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_HELD_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_HELD_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    kv_tokens_held: int
    kv_tokens_capacity: float
    requests_held: int
    requests_capacity: float
    waiting: _containers.ScalarMap[str, int]
    oldest_wait_s: float
    def __init__(self, pool: _Optional[str] = ..., kv_tokens_held: _Optional[int] = ..., kv_tokens_capacity: _Optional[float] = ..., requests_held: _Optional[int] = ..., requests_capacity: _Optional[float] = ..., waiting: _Optional[_Mapping[str, int]] = ..., oldest_wait_s: _Optional[float] = ...) -> None: ...

class Breaker(_message.Message):
    __slots__ = ("pool", "level", "signal_level", "probing", "drill_level", "drill_remaining_s", "signals", "last_transition")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PROBING_FIELD_NUMBER: _ClassVar[int]
    DRILL_LEVEL_FIELD_NUMBER: _ClassVar[int]
    DRILL_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_FIELD_NUMBER: _ClassVar[int]
    pool: str
    level: int
    signal_level: int
    probing: bool
    drill_level: int
    drill_remaining_s: float
    signals: Signals
    last_transition: str
    def __init__(self, pool: _Optional[str] = ..., level: _Optional[int] = ..., signal_level: _Optional[int] = ..., probing: _Optional[bool] = ..., drill_level: _Optional[int] = ..., drill_remaining_s: _Optional[float] = ..., signals: _Optional[_Union[Signals, _Mapping]] = ..., last_transition: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("breakers", "budget_store", "redis_up", "policy_source", "keys", "inflight_requests", "gpu_available", "quota_multipliers", "load_score", "load_forecast", "admission", "kv_ledger", "engines", "ahead_raises", "ahead_kv_share_caps", "ahead_lent", "ahead_expired", "region")
    class QuotaMultipliersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AheadKvShareCapsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AheadExpiredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_STORE_FIELD_NUMBER: _ClassVar[int]
    REDIS_UP_FIELD_NUMBER: _ClassVar[int]
    POLICY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GPU_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_MULTIPLIERS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SCORE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FORECAST_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    KV_LEDGER_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    AHEAD_RAISES_FIELD_NUMBER: _ClassVar[int]
    AHEAD_KV_SHARE_CAPS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_LENT_FIELD_NUMBER: _ClassVar[int]
    AHEAD_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    breakers: _containers.RepeatedCompositeFieldContainer[Breaker]
    budget_store: str
    redis_up: bool
    policy_source: str
    keys: int
    inflight_requests: int
    gpu_available: bool
    quota_multipliers: _containers.ScalarMap[str, float]
    load_score: float
    load_forecast: float
    admission: _containers.RepeatedCompositeFieldContainer[PoolAdmission]
    kv_ledger: str
    engines: _containers.RepeatedCompositeFieldContainer[EngineReading]
    ahead_raises: _containers.RepeatedCompositeFieldContainer[AheadRaise]
    ahead_kv_share_caps: _containers.ScalarMap[str, float]
    ahead_lent: float
    ahead_expired: _containers.ScalarMap[str, str]
    region: RegionStatus
    def __init__(self, breakers: _Optional[_Iterable[_Union[Breaker, _Mapping]]] = ..., budget_store: _Optional[str] = ..., redis_up: _Optional[bool] = ..., policy_source: _Optional[str] = ..., keys: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., gpu_available: _Optional[bool] = ..., quota_multipliers: _Optional[_Mapping[str, float]] = ..., load_score: _Optional[float] = ..., load_forecast: _Optional[float] = ..., admission: _Optional[_Iterable[_Union[PoolAdmission, _Mapping]]] = ..., kv_ledger: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[EngineReading, _Mapping]]] = ..., ahead_raises: _Optional[_Iterable[_Union[AheadRaise, _Mapping]]] = ..., ahead_kv_share_caps: _Optional[_Mapping[str, float]] = ..., ahead_lent: _Optional[float] = ..., ahead_expired: _Optional[_Mapping[str, str]] = ..., region: _Optional[_Union[RegionStatus, _Mapping]] = ...) -> None: ...

class RegionStatus(_message.Message):
    __slots__ = ("region", "ledger_state", "holder", "seq", "lease_expires_in_s", "tenants")
    REGION_FIELD_NUMBER: _ClassVar[int]
    LEDGER_STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    region: str
    ledger_state: str
    holder: bool
    seq: int
    lease_expires_in_s: float
    tenants: _containers.RepeatedCompositeFieldContainer[RegionTenant]
    def __init__(self, region: _Optional[str] = ..., ledger_state: _Optional[str] = ..., holder: _Optional[bool] = ..., seq: _Optional[int] = ..., lease_expires_in_s: _Optional[float] = ..., tenants: _Optional[_Iterable[_Union[RegionTenant, _Mapping]]] = ...) -> None: ...

class RegionTenant(_message.Message):
    __slots__ = ("tenant", "share", "usage", "global_usage")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_USAGE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    share: float
    usage: float
    global_usage: float
    def __init__(self, tenant: _Optional[str] = ..., share: _Optional[float] = ..., usage: _Optional[float] = ..., global_usage: _Optional[float] = ...) -> None: ...

class AheadRaise(_message.Message):
    __slots__ = ("tenant", "reason", "multiple", "since_s", "ramp_came")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    SINCE_S_FIELD_NUMBER: _ClassVar[int]
    RAMP_CAME_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    reason: str
    multiple: float
    since_s: float
    ramp_came: bool
    def __init__(self, tenant: _Optional[str] = ..., reason: _Optional[str] = ..., multiple: _Optional[float] = ..., since_s: _Optional[float] = ..., ramp_came: _Optional[bool] = ...) -> None: ...

class EngineReading(_message.Message):
    __slots__ = ("pool", "endpoint", "engine", "age_s", "kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate", "first_tokens", "state", "dead_reason", "kv_capacity_tokens", "held_tokens", "held_requests", "picked", "answered", "failed")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HELD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HELD_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PICKED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    pool: str
    endpoint: str
    engine: str
    age_s: float
    kv_cache_usage: float
    running: float
    waiting: float
    prefix_cache_hit_rate: float
    first_tokens: float
    state: str
    dead_reason: str
    kv_capacity_tokens: float
    held_tokens: int
    held_requests: int
    picked: int
    answered: int
    failed: int
    def __init__(self, pool: _Optional[str] = ..., endpoint: _Optional[str] = ..., engine: _Optional[str] = ..., age_s: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., running: _Optional[float] = ..., waiting: _Optional[float] = ..., prefix_cache_hit_rate: _Optional[float] = ..., first_tokens: _Optional[float] = ..., state: _Optional[str] = ..., dead_reason: _Optional[str] = ..., kv_capacity_tokens: _Optional[float] = ..., held_tokens: _Optional[int] = ..., held_requests: _Optional[int] = ..., picked: _Optional[int] = ..., answered: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("engine", "pool", "undo")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    engine: str
    pool: str
    undo: bool
    def __init__(self, engine: _Optional[str] = ..., pool: _Optional[str] = ..., undo: _Optional[bool] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[EngineReading]
    def __init__(self, engines: _Optional[_Iterable[_Union[EngineReading, _Mapping]]] = ...) -> None: ...

class KeysRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("requests_per_minute", "tokens_per_minute", "tokens_per_hour", "concurrent_requests", "max_context_tokens")
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    requests_per_minute: int
    tokens_per_minute: int
    tokens_per_hour: int
    concurrent_requests: int
    max_context_tokens: int
    def __init__(self, requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ..., tokens_per_hour: _Optional[int] = ..., concurrent_requests: _Optional[int] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...

class KeyStatus(_message.Message):
    __slots__ = ("key_id", "tenant", "tier", "limits", "outstanding", "usage_1m", "usage_5m", "usage_1h", "dynamic_tokens_per_minute", "safety_factor", "demand_tokens_per_minute", "demand_forecast_tokens_per_minute")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    USAGE_1M_FIELD_NUMBER: _ClassVar[int]
    USAGE_5M_FIELD_NUMBER: _ClassVar[int]
    USAGE_1H_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    DEMAND_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FORECAST_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    tenant: str
    tier: str
    limits: Limits
    outstanding: int
    usage_1m: float
    usage_5m: float
    usage_1h: float
    dynamic_tokens_per_minute: float
    safety_factor: float
    demand_tokens_per_minute: float
    demand_forecast_tokens_per_minute: float
    def __init__(self, key_id: _Optional[str] = ..., tenant: _Optional[str] = ..., tier: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., outstanding: _Optional[int] = ..., usage_1m: _Optional[float] = ..., usage_5m: _Optional[float] = ..., usage_1h: _Optional[float] = ..., dynamic_tokens_per_minute: _Optional[float] = ..., safety_factor: _Optional[float] = ..., demand_tokens_per_minute: _Optional[float] = ..., demand_forecast_tokens_per_minute: _Optional[float] = ...) -> None: ...

class KeysReply(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ...) -> None: ...

class DrillRequest(_message.Message):
    __slots__ = ("pool", "level", "minutes")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    pool: str
    level: int
    minutes: float
    def __init__(self, pool: _Optional[str] = ..., level: _Optional[int] = ..., minutes: _Optional[float] = ...) -> None: ...

class DrillReply(_message.Message):
    __slots__ = ("pool", "level", "remaining_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    level: int
    remaining_s: float
    def __init__(self, pool: _Optional[str] = ..., level: _Optional[int] = ..., remaining_s: _Optional[float] = ...) -> None: ...

class ReloadPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadPolicyReply(_message.Message):
    __slots__ = ("ok", "error", "keys")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    keys: int
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ..., keys: _Optional[int] = ...) -> None: ...

class StoredKey(_message.Message):
    __slots__ = ("key_id", "tenant", "tier", "limits", "created_at", "expires_at", "revoked_at", "state", "source", "note")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    tenant: str
    tier: str
    limits: Limits
    created_at: float
    expires_at: float
    revoked_at: float
    state: str
    source: str
    note: str
    def __init__(self, key_id: _Optional[str] = ..., tenant: _Optional[str] = ..., tier: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., created_at: _Optional[float] = ..., expires_at: _Optional[float] = ..., revoked_at: _Optional[float] = ..., state: _Optional[str] = ..., source: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class AddKeyRequest(_message.Message):
    __slots__ = ("key_sha256", "tenant", "tier", "limits", "expires_in_s")
    KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    key_sha256: str
    tenant: str
    tier: str
    limits: Limits
    expires_in_s: float
    def __init__(self, key_sha256: _Optional[str] = ..., tenant: _Optional[str] = ..., tier: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class RotateKeyRequest(_message.Message):
    __slots__ = ("key_id", "new_key_sha256", "grace_s")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    new_key_sha256: str
    grace_s: float
    def __init__(self, key_id: _Optional[str] = ..., new_key_sha256: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class KeyChange(_message.Message):
    __slots__ = ("keys", "store", "replicas_applied", "replicas_live", "propagation_s")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_LIVE_FIELD_NUMBER: _ClassVar[int]
    PROPAGATION_S_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[StoredKey]
    store: str
    replicas_applied: int
    replicas_live: int
    propagation_s: float
    def __init__(self, keys: _Optional[_Iterable[_Union[StoredKey, _Mapping]]] = ..., store: _Optional[str] = ..., replicas_applied: _Optional[int] = ..., replicas_live: _Optional[int] = ..., propagation_s: _Optional[float] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListKeysReply(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[StoredKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[StoredKey, _Mapping]]] = ...) -> None: ...
