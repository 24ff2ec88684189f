"""KV admission as a step: hold a request's KV footprint in its pool, or refuse with 503.

What lives here: `KvStep`. For pools with `kv_capacity_tokens` or `max_num_seqs`, it asks
the ledger (breaker.kv_admission) whether the request's tier may still fill its pool — the
footprint of every completion it may generate, one batch slot each — and holds it until the
request ends; each hold has a deadline (`ttl_s`), past which `expire` frees it if its end
was never seen. A refusal is a 503 with a 1 s Retry-After: the pool is full right now, which
says nothing about the caller's budget, and room frees as soon as any request ends.
Cheap requests (tokenize, the model list) hold nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.decision import Admitted, RequestOutcome, RoutingDecision
from admission.errors import Overloaded
from admission.events import KvEvents
from breaker.kv_admission import KvLedger, kv_footprint, pool_capacity
from policy import Policy


class KvStep:
    def __init__(
        self,
        events: KvEvents,
        clock: Callable[[], float],
        ttl_s: float,
        ledger: KvLedger | None = None,
    ) -> None:
        self._events = events
        self._clock = clock
        self._ttl_s = ttl_s
        self.ledger = ledger or KvLedger()

    async def admit(self, decision: RoutingDecision, request_id: str, policy: Policy) -> Admitted:
        if not decision.meters_tokens:
            return Admitted(decision)  # one cheap request: no KV, no batch slot
        spec = policy.pools.get(decision.pool)
        capacity = None if spec is None else pool_capacity(spec, policy.budget.replicas)
        if capacity is None:
            return Admitted(decision)
        share = policy.breaker.kv_shares[decision.caller.tier]
        tokens = kv_footprint(decision.reserved_tokens, decision.bucket)
        verdict = self.ledger.admit(
            request_id,
            decision.pool,
            tokens,
            capacity,
            share,
            sequences=decision.sequences,
            fixed=decision.runs_to_limit,
            deadline_s=self._clock() + self._ttl_s,
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

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        self.ledger.release(request_id)

    async def settle(self, outcome: RequestOutcome) -> None:
        """The request ended (or expired): its footprint is free again."""
        self.ledger.release(outcome.tracking_id)

    def expire(self) -> list[str]:
        return self.ledger.expire(self._clock())

    def observe(self, policy: Policy, kv_cache_usage: Callable[[str], float | None]) -> None:
        """Each controller interval: learn each pool's real-to-counted KV ratio."""
        for name in self.ledger.observe_pools(policy.pools, policy.budget.replicas, kv_cache_usage):
            self._events.footprint_ratio(name, self.ledger.ratio.get(name, 1.0))
