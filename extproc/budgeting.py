"""Budgets on the request path: reserve before routing, settle from the access log.

What lives here: `BudgetGate`, the Admission that reserves a request's weighted estimate
in the key's budget (429 with Retry-After when it does not fit) and the OutcomeSink that
settles it with the real usage; plus the pure rules for what a request is charged.

Charges: reserved = (prompt estimate + max_tokens) x the context bucket's cost weight.
Settled = (prompt + completion tokens from upstream usage) x the same weight. Without
usage: an upstream error (status >= 400) refunds everything; a success without usage (a
client that went away mid-stream) keeps the reservation, since the GPU did the work.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from budget.ledger import Charge, Verdict, scale_limits
from budget.store import BudgetStore
from extproc.accesslog import RequestOutcome
from extproc.errors import ContextLengthExceeded, RateLimited
from extproc.metrics import SidecarMetrics
from extproc.request_flow import Admitted, RoutingDecision
from policy import Limits

log = logging.getLogger("slogate.budget")


def reserved_charge(decision: RoutingDecision) -> Charge:
    """The prompt once plus every completion's limit, at the bucket's weight; one request and
    no tokens for the cheap APIs."""
    raw = decision.reserved_tokens
    return Charge(raw * decision.bucket.cost_weight, raw)


def settled_charge(outcome: RequestOutcome) -> Charge | None:
    """What the request is finally charged; None refunds it.

    With the engine's usage: prompt + completion tokens. Without it: an upstream error (or
    no response at all) refunds everything; a stream that was cut before its usage arrived
    is charged its prompt and one token per event it sent (Envoy saw every one of them);
    any other success without usage keeps the reservation (the GPU did the work).
    """
    decision = outcome.decision
    if not decision.meters_tokens:
        return Charge(0.0, 0)  # it counted as one request; nothing to settle
    prompt = outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens
    weight = decision.bucket.cost_weight
    if outcome.completion_tokens is not None:
        raw = prompt + outcome.completion_tokens
        return Charge(raw * weight, raw)
    if outcome.stream_events:
        sent = min(outcome.stream_events, decision.sequences * decision.max_tokens)
        return Charge((prompt + sent) * weight, prompt + sent)
    if outcome.status >= 400 or outcome.status == 0:  # upstream error, or never sent
        return None
    return reserved_charge(decision)


def _duration_text(seconds: float) -> str:
    """OpenAI's reset format: '6m0s', '1s', '250ms'."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rate_limit_headers(verdict: Verdict) -> dict[str, str]:
    headers: dict[str, str] = {}
    if verdict.limit_requests is not None and verdict.remaining_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(verdict.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(max(0, verdict.remaining_requests))
    if verdict.limit_tokens is not None and verdict.remaining_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(verdict.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, verdict.remaining_tokens))
        headers["x-ratelimit-reset-tokens"] = _duration_text(verdict.reset_tokens_s)
    return headers


class BudgetGate:
    def __init__(
        self,
        store: BudgetStore,
        metrics: SidecarMetrics,
        ttl_s: float,
        scale: Callable[[RoutingDecision], float] | None = None,
        ceiling: Callable[[RoutingDecision], float | None] | None = None,
        on_settled: Callable[[RoutingDecision, Charge], None] | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._ttl_s = ttl_s
        # The breaker shrinks low-tier budgets under load: the key's limits times this.
        self._scale = scale
        # The controller's per-key tokens-per-minute ceiling, when enforced.
        self._ceiling = ceiling
        self._on_settled = on_settled

    def _limits(self, decision: RoutingDecision) -> Limits:
        limits = decision.caller.limits
        if self._scale is not None:
            limits = scale_limits(limits, self._scale(decision))
        ceiling = self._ceiling(decision) if self._ceiling is not None else None
        if ceiling is not None and limits.tokens_per_minute is not None:
            limits = dataclasses.replace(
                limits, tokens_per_minute=max(1, min(limits.tokens_per_minute, int(ceiling)))
            )
        return limits

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        caller = decision.caller
        limits = self._limits(decision)
        if limits.max_context_tokens is not None and decision.context_tokens > (
            limits.max_context_tokens
        ):
            raise ContextLengthExceeded(
                f"This API key allows at most {limits.max_context_tokens} tokens of context "
                f"per request; you requested {decision.context_tokens}.",
                reason="key_context_limit",
            )
        verdict = await self._store.reserve(
            caller.key_id, limits, reserved_charge(decision), reservation_id, self._ttl_s
        )
        headers = rate_limit_headers(verdict)
        self._metrics.budget_decisions(caller.tenant_label, verdict.reason).inc()
        if verdict.admitted:
            return Admitted(decision, headers)
        if verdict.retry_after_s is None:
            raise RateLimited(
                f"Request too large for this API key: it needs "
                f"{reserved_charge(decision).weighted_tokens:.0f} weighted tokens and the "
                f"key's limit ({verdict.reason}) is smaller. Reduce max_tokens or the prompt.",
                reason=f"budget_{verdict.reason}",
                headers=headers,
            )
        raise RateLimited(
            f"Rate limit reached for this API key ({verdict.reason}). "
            f"Please try again in {math.ceil(verdict.retry_after_s)}s.",
            reason=f"budget_{verdict.reason}",
            retry_after_s=max(1, math.ceil(verdict.retry_after_s)),
            headers=headers,
        )

    async def record(self, outcome: RequestOutcome) -> None:
        """OutcomeSink: settle the request's reservation with what it really used."""
        if outcome.expired:
            return  # the store expires the reservation itself (slot freed, charge kept)
        decision = outcome.decision
        actual = settled_charge(outcome)
        try:
            settled = await self._store.settle(
                decision.caller.key_id, self._limits(decision), outcome.tracking_id, actual
            )
        except Exception:
            log.exception("settling %s failed; the reservation will expire", outcome.tracking_id)
            return
        if settled and actual is not None:
            self._metrics.tenant_tokens(decision.caller.tenant_label).inc(actual.raw_tokens)
            if self._on_settled is not None:
                self._on_settled(decision, actual)
