"""KV admission on the request path: hold a request's KV footprint in its pool, or 503.

What lives here: `KvGate`, the Admission that asks `breaker.kv_admission.KvLedger` whether
the request's tier may still fill its pool (pools with `kv_capacity_tokens` or
`max_num_seqs` only), and the OutcomeSink that frees the footprint when the request's
access-log entry (or its expiry) comes back. A refusal is a 503 with a 1 s Retry-After:
the pool is full right now, which says nothing about the caller's budget, and room frees
as soon as any request ends.
"""

from __future__ import annotations

from collections.abc import Callable

from breaker.kv_admission import KvLedger, kv_footprint, pool_capacity
from extproc.accesslog import RequestOutcome
from extproc.errors import Overloaded
from extproc.metrics import SidecarMetrics
from extproc.request_flow import Admitted, RoutingDecision
from policy import Policy


class KvGate:
    def __init__(self, policy: Callable[[], Policy], metrics: SidecarMetrics) -> None:
        self._policy = policy
        self._metrics = metrics
        self.ledger = KvLedger()
        metrics.admission.source = lambda: (self.ledger.in_flight, self.ledger.requests)

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        if not decision.meters_tokens:
            return Admitted(decision)  # one cheap request: no KV, no batch slot
        policy = self._policy()
        spec = policy.pools.get(decision.pool)
        capacity = None if spec is None else pool_capacity(spec, policy.budget.replicas)
        if capacity is None:
            return Admitted(decision)
        share = policy.breaker.kv_shares[decision.caller.tier]
        tokens = kv_footprint(decision.reserved_tokens, decision.bucket)
        verdict = self.ledger.admit(
            reservation_id,
            decision.pool,
            tokens,
            capacity,
            share,
            sequences=decision.sequences,
            fixed=decision.runs_to_limit,
        )
        if verdict.admitted:
            return Admitted(decision)
        tier = decision.caller.tier.value
        if verdict.limit == "kv_cache":
            raise Overloaded(
                f"The {decision.pool!r} pool has no KV-cache room for this request's context "
                f"({decision.context_tokens} tokens) at the {tier} tier right now. Please "
                f"retry shortly, or lower max_tokens.",
                reason="kv_cache_full",
                retry_after_s=1,
            )
        raise Overloaded(
            f"The {decision.pool!r} pool runs as many requests as it may at the {tier} tier "
            f"right now. Please retry shortly.",
            reason="sequences_full",
            retry_after_s=1,
        )

    def observe(self, kv_cache_usage: Callable[[str], float | None]) -> None:
        """Each controller interval: learn each pool's real-to-counted KV ratio."""
        policy = self._policy()
        for name in self.ledger.observe_pools(policy.pools, policy.budget.replicas, kv_cache_usage):
            self._metrics.kv_footprint_ratio(name).set(self.ledger.ratio.get(name, 1.0))

    async def release(self, decision: RoutingDecision, reservation_id: str) -> None:
        """Undo an admission a later step refused."""
        self.ledger.release(reservation_id)

    async def record(self, outcome: RequestOutcome) -> None:
        """OutcomeSink: the request ended (or expired): its footprint is free again."""
        await self.release(outcome.decision, outcome.tracking_id)
