"""slogate's configuration and domain types: the bottom layer, importing nothing of ours.

`policy.domain` holds the small value types (tier, key, limits, bucket, pool, tenant) and the
one rule that makes a caller (`build_caller`), `policy.apis` the catalogue of engine APIs
slogate guards, `policy.schema` the frozen `Policy`, and `policy.loader` the strict YAML
reader. Everything public is re-exported here.
"""

from policy._reader import PolicyError
from policy._traffic import TrafficRecordConfig
from policy.domain import (
    LIMIT_FIELDS,
    ApiKey,
    ContextBucket,
    EngineKind,
    FailureMode,
    LatencyFit,
    Limits,
    Picker,
    Pool,
    RouteRule,
    SpendLimits,
    SpendPrices,
    SpendUnit,
    Tenant,
    TenantBook,
    TenantWeights,
    Tier,
    build_caller,
    hash_api_key,
)
from policy.loader import load_policy, parse_policy
from policy.schema import (
    BreakerConfig,
    BreakerThresholds,
    BudgetConfig,
    BudgetStoreKind,
    CountingConfig,
    DecisionLogConfig,
    EngineHealthConfig,
    EnginesConfig,
    JwtConfig,
    PickingConfig,
    Policy,
    ShadowConfig,
    TlsConfig,
    WaitingRoomConfig,
    start_only_changes,
)

__all__ = [
    "LIMIT_FIELDS",
    "ApiKey",
    "BreakerConfig",
    "BreakerThresholds",
    "BudgetConfig",
    "BudgetStoreKind",
    "ContextBucket",
    "CountingConfig",
    "DecisionLogConfig",
    "EngineHealthConfig",
    "EngineKind",
    "EnginesConfig",
    "FailureMode",
    "JwtConfig",
    "LatencyFit",
    "Limits",
    "Picker",
    "PickingConfig",
    "Policy",
    "PolicyError",
    "Pool",
    "RouteRule",
    "ShadowConfig",
    "SpendLimits",
    "SpendPrices",
    "SpendUnit",
    "Tenant",
    "TenantBook",
    "TenantWeights",
    "Tier",
    "TlsConfig",
    "TrafficRecordConfig",
    "WaitingRoomConfig",
    "build_caller",
    "hash_api_key",
    "load_policy",
    "parse_policy",
    "start_only_changes",
]
