"""Per-key token budgets and the policy that defines them.

What lives here: the policy schema and its strict loader (`budget.policy`), the pure
reserve/settle arithmetic (`budget.ledger`), the store interface with the in-process store
(`budget.store`) and the Redis store with its Lua scripts (`budget.redis_store`,
`budget/lua/`). Nothing here does network I/O except the Redis store.
"""

from budget.ledger import Charge, Limits, Verdict
from budget.policy import (
    ApiKey,
    BudgetConfig,
    BudgetStoreKind,
    ContextBucket,
    Policy,
    PolicyError,
    Pool,
    RouteRule,
    Tier,
    hash_api_key,
    load_policy,
    parse_policy,
)

__all__ = [
    "ApiKey",
    "BudgetConfig",
    "BudgetStoreKind",
    "Charge",
    "ContextBucket",
    "Limits",
    "Policy",
    "PolicyError",
    "Pool",
    "RouteRule",
    "Tier",
    "Verdict",
    "hash_api_key",
    "load_policy",
    "parse_policy",
]
