"""The tiered breaker: what the response path reports, judged against the objectives, moves
each pool's level, and the level sheds traffic. Pure: no I/O, callers inject the clock.

What lives here:
- `latency`     sliding-window latency histograms and 5xx counts (`ResponseWindows`).
- `objectives`  what a finished request's latency is held against (like with like).
- `engine`      each engine's signals parsed from its /metrics (vLLM's or SGLang's names), and
                what "no data" means (stale reads as saturated).
- `levels`      the level state machine: entry rules as a table, one `step()`.
- `shedding`    what each level refuses, and the budgets' multiplier per level.
- `board`       every breaker of one sidecar (one per pool and a global one), and the load
                score the quota controller steps on (its controller lives in budget.quotas).

Not here: the quota controller (budget.quotas, budget.key_quotas: it moves budgets) and KV
admission (admission.kv).
"""
