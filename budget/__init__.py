"""Per-key token budgets and the policy that defines them.

What lives here: the policy schema and its strict loader (`budget.policy`). The ledger
arithmetic and the stores come with the budget work; nothing in this package does network
I/O except the Redis store.
"""

from budget.policy import (
    ApiKey,
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
    "ContextBucket",
    "Policy",
    "PolicyError",
    "Pool",
    "RouteRule",
    "Tier",
    "hash_api_key",
    "load_policy",
    "parse_policy",
]
