"""Per-key token budgets: reserve on the request, settle on the response.

What lives here: the pure reserve/settle arithmetic (`budget.ledger`), the store interface
with the in-process store (`budget.store`), failover to local shares (`budget.failover`)
and the Redis store with its Lua scripts (`budget.redis_store`, `budget/lua/`); and the
tenants' spend budgets per day and month, the same way: the arithmetic (`budget.spend`),
the in-process store (`budget.spend_store`), the Redis one (`budget.spend_redis`). Nothing here
does network I/O except the Redis store. The policy that sets the limits lives in `policy`.
"""

from budget.ledger import Charge, Verdict

__all__ = ["Charge", "Verdict"]
