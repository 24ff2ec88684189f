"""Per-key token budgets: reserve on the request, settle on the response; and the quota
controller that moves their limits.

What lives here:
- `ledger`          the pure reserve/settle arithmetic (clock from the caller).
- `store`           the store interface and the in-process store; `prefixed_store` (a store
                    under a key prefix), `failover` (local shares while Redis is away).
- `redis_store`     the Redis store, its Lua scripts in budget/lua/ (reserve, settle, and
                    the `time.lua` prelude every slogate script starts with), loaded and
                    called by `redis_scripts` (also for the KV ledger's, admission.kv).
- `spend`, `spend_store`, `spend_redis`  the tenants' spend budgets per day and month, the
                    same way: the arithmetic, the in-process store, the Redis one;
                    `spend_backlog`, the settlements a slow Redis could not take yet.
- `quotas`          the dynamic quota controller: per-tier multipliers on the budgets from
                    the load score (breaker.board.load_score), Holt-Winters forecasts.
- `key_quotas`      per-key dynamic tokens-per-minute ceilings from each key's consumption.

Nothing here does network I/O except the Redis stores. The policy that sets the limits
lives in `policy`; the breaker's signals in `breaker` (the two are independent layers).
"""
