"""Admission: whether a request may run now, on which pool, at what cost.

Grpc-free and I/O-free, except through the stores it is given and admission.kv.redis_ledger
(the KV ledger in Redis; import-linter names the exception). What lives here:
- `decision`      the types: a routing decision, an admitted request, its outcome.
- `chain`         the `Step` protocol and `AdmissionChain`, which runs the steps in order.
- `assembly`      `build_admission`: the chain the sidecar and the simulator both run.
- `breaker_step`, `budget_step`, `spend_step`  one module per step: the breaker's level, the
                  key's budgets, the tenant's spend budget.
- `kv/`           KV admission: capacity arithmetic, the ledgers (local, failover, Redis
                  with its Lua scripts), the KV step and the waiting room's dispatcher.
- `waiting_room`  where a request refused only for capacity waits, and in what order (the
                  KV step puts it there, kv.dispatch offers it room).
- `access`        the access check (suspended tenant, zero limit, forbidden pool).
- `events`        what each step reports to its observers; `signals` an outcome as the
                  breaker's signals; `errors` the refusals a request can end with.
"""
