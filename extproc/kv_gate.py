"""KV admission on the request path: hold a request's KV footprint in its pool, or 503.

What lives here: `KvGate`, the Admission that asks `breaker.kv_admission.KvLedger` whether
the request's tier may still fill its pool (pools with `kv_capacity_tokens` only), and the
OutcomeSink that frees the footprint when the request's access-log entry (or its expiry)
comes back. A refusal is a 503 with a 1 s Retry-After: the pool is full right now, which
says nothing about the caller's budget, and a slot frees as soon as any request ends.
"""

from __future__ import annotations

from collections.abc import Callable

from breaker.kv_admission import KvLedger, kv_footprint
from budget.policy import Policy
from extproc.accesslog import RequestOutcome
from extproc.errors import Overloaded
from extproc.metrics import SidecarMetrics
from extproc.request_flow import Admitted, RoutingDecision


class KvGate:
    def __init__(self, policy: Callable[[], Policy], metrics: SidecarMetrics) -> None:
        self._policy = policy
        self._metrics = metrics
        self.ledger = KvLedger()

    def capacity_tokens(self, pool: str) -> float | None:
        """This sidecar's part of the pool's KV cache: capacity / replicas."""
        policy = self._policy()
        spec = policy.pools.get(pool)
        if spec is None or spec.kv_capacity_tokens is None:
            return None
        return spec.kv_capacity_tokens / policy.budget.replicas

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        capacity = self.capacity_tokens(decision.pool)
        if capacity is None:
            return Admitted(decision)
        share = self._policy().breaker.kv_shares[decision.caller.tier]
        tokens = kv_footprint(decision.context_tokens, decision.bucket)
        verdict = self.ledger.admit(reservation_id, decision.pool, tokens, capacity, share)
        self._metrics.kv_in_flight(decision.pool).set(verdict.in_flight_tokens)
        if verdict.admitted:
            return Admitted(decision)
        raise Overloaded(
            f"The {decision.pool!r} pool has no KV-cache room for this request's context "
            f"({decision.context_tokens} tokens) at the {decision.caller.tier.value} tier "
            f"right now. Please retry shortly, or lower max_tokens.",
            reason="kv_cache_full",
            retry_after_s=1,
        )

    async def release(self, decision: RoutingDecision, reservation_id: str) -> None:
        """Undo an admission a later step refused."""
        if self.ledger.release(reservation_id):
            self._metrics.kv_in_flight(decision.pool).set(self.ledger.in_flight[decision.pool])

    async def record(self, outcome: RequestOutcome) -> None:
        """OutcomeSink: the request ended (or expired): its footprint is free again."""
        await self.release(outcome.decision, outcome.tracking_id)
