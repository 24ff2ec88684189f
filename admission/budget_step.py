"""Budgets as an admission step: reserve before routing, settle when the request ends.

What lives here: `BudgetStep`, which reserves a request's weighted tokens in the key's
budget (429 with Retry-After when it does not fit), refunds them when a later step refuses
or the request dies, and settles them with the real usage; `effective_limits` (the key's
limits scaled by the breaker level the request met and the quota controller's tier
multiplier, capped by the key's dynamic ceiling when the policy enforces it, and for a
tenant whose scope is global, scaled by this region's share of it: admission.regions);
and the pure rules for what a request is charged. The limits a request was reserved under
travel in its decision, so it is settled against them, whatever has changed since.

Charges: reserved = (prompt count + completions x max_tokens) x the context bucket's cost
weight. Settled = (prompt + completion tokens from upstream usage) x the same weight (see
`settled_charge` for what happens without usage).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Protocol

from admission.decision import Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import ContextLengthExceeded, RateLimited
from admission.events import BudgetEvents
from admission.regions import RegionShares, global_tenant
from breaker.shedding import budget_multiplier
from budget.ledger import Charge, Verdict, scale_limits
from budget.region_demand import RegionDemand
from budget.store import BudgetStore
from policy.domain import ApiKey, Limits
from policy.schema import Policy

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


class KeyCeilings(Protocol):
    """The quota controller's per-key tokens-per-minute ceilings (budget.key_quotas)."""

    def tokens_per_minute(self, key: ApiKey) -> float | None: ...


def effective_limits(
    decision: RoutingDecision,
    policy: Policy,
    multipliers: Mapping[str, float],
    ceilings: KeyCeilings | None,
    shares: RegionShares | None = None,
) -> Limits:
    """The key's limits for this request: times the breaker level's multiplier for its tier
    and the controller's tier multiplier; its tokens per minute capped by the dynamic
    ceiling when `breaker.controller_key_budgets` is on. A global tenant's limits are also
    times this region's share of them (`shares`; a share of 0 leaves every rate at its
    floor of 1: BudgetStep refuses such a tenant outright)."""
    caller = decision.caller
    factor = budget_multiplier(decision.level, caller.tier) * multipliers.get(
        caller.tier.value, 1.0
    )
    if shares is not None and global_tenant(policy, caller.tenant):
        share = shares.share(caller.tenant)
        if share is not None:
            factor *= share
    limits = scale_limits(caller.limits, factor)
    if policy.breaker.controller_key_budgets and ceilings is not None:
        ceiling = ceilings.tokens_per_minute(caller)
        if ceiling is not None and limits.tokens_per_minute is not None:
            limits = dataclasses.replace(
                limits, tokens_per_minute=max(1, min(limits.tokens_per_minute, int(ceiling)))
            )
    return limits


class BudgetStep:
    def __init__(
        self,
        store: BudgetStore,
        events: BudgetEvents,
        ttl_s: float,
        multipliers: Mapping[str, float] | None = None,
        ceilings: KeyCeilings | None = None,
        shares: RegionShares | None = None,
        demand: RegionDemand | None = None,
    ) -> None:
        """`shares`: this region's share of each global tenant (None: one region);
        `demand`: where the global tenants' demand and usage are counted for the region's
        report to the global ledger."""
        self._store = store
        self._events = events
        self._ttl_s = ttl_s  # a reservation outlives the longest request by this
        # The quota controller's tier multipliers (budget.quotas.TierMultipliers.values),
        # read at each admission: a change applies to the next request.
        self._multipliers: Mapping[str, float] = multipliers if multipliers is not None else {}
        self._ceilings = ceilings
        self._shares = shares
        self._demand = demand

    async def admit(self, applicant: Applicant) -> Admitted:
        decision = applicant.decision
        if not decision.charged_here:
            return Admitted(decision)  # crossed from its origin, which reserved it
        caller = decision.caller
        policy = applicant.policy
        # The context cap is not a rate: no multiplier or share scales it.
        max_context = caller.limits.max_context_tokens
        if max_context is not None and decision.context_tokens > max_context:
            raise ContextLengthExceeded(
                f"This API key allows at most {max_context} tokens of context "
                f"per request; you requested {decision.context_tokens}.",
                reason="key_context_limit",
            )
        charge = reserved_charge(decision)
        if global_tenant(policy, caller.tenant):
            # Before the limits: a tenant new to the region may wait here for the share
            # they are scaled by.
            await self._regional(caller.tenant, caller.tenant_label, charge, policy)
        limits = effective_limits(decision, policy, self._multipliers, self._ceilings, self._shares)
        verdict = await self._store.reserve(
            caller.budget_id, limits, charge, applicant.request_id, self._ttl_s
        )
        headers = rate_limit_headers(verdict)
        self._events.budget_decision(caller.tenant_label, verdict.reason)
        if verdict.admitted:
            if limits is not (decision.limits or caller.limits):  # None reads as the key's
                decision = dataclasses.replace(decision, limits=limits)
            return Admitted(decision, headers)
        whose = f"tenant {caller.tenant!r}" if caller.shared_budget else "this API key"
        if verdict.retry_after_s is None:
            raise RateLimited(
                f"Request too large for {whose}: it needs "
                f"{reserved_charge(decision).weighted_tokens:.0f} weighted tokens and the "
                f"limit ({verdict.reason}) is smaller. Reduce max_tokens or the prompt.",
                reason=f"budget_{verdict.reason}",
                headers=headers,
            )
        raise RateLimited(
            f"Rate limit reached for {whose} ({verdict.reason}). "
            f"Please try again in {math.ceil(verdict.retry_after_s)}s.",
            reason=f"budget_{verdict.reason}",
            retry_after_s=max(1, math.ceil(verdict.retry_after_s)),
            headers=headers,
        )

    async def _regional(self, tenant: str, label: str, charge: Charge, policy: Policy) -> None:
        """A global tenant's request: its demand counted for the region's report (reserved
        or refused alike: what it asked of this region), refused outright while this
        region holds no share of it. A tenant no lease names yet (new to this region)
        waits for the region's next lease rather than being refused: two intervals and a
        report's timeout at most (its demand, counted here, goes out with the region's
        next report)."""
        if self._demand is not None:
            self._demand.asked(tenant, charge.weighted_tokens)
        if self._shares is not None and self._shares.share(tenant) == 0.0:
            ledger = policy.regions.ledger
            await self._shares.first_lease(
                tenant, 2 * ledger.report_interval_s + ledger.timeout_ms / 1000.0
            )
        if self._shares is not None and self._shares.share(tenant) == 0.0:
            self._events.budget_decision(label, "region_share")
            raise RateLimited(
                f"Rate limit reached for tenant {tenant!r}: its budget is global and "
                "this region holds no share of it now (no lease for it yet, the region is "
                "cut off from the global ledger past its lease, or the other regions hold "
                "it all). "
                f"Please try again in {math.ceil(policy.regions.ledger.report_interval_s)}s.",
                reason="budget_region_share",
                retry_after_s=max(1, math.ceil(policy.regions.ledger.report_interval_s)),
            )

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """A later step refused, or the request died: the whole reservation is refunded."""
        if not decision.charged_here:
            return
        await self._store.settle(
            decision.caller.budget_id, decision.limits or decision.caller.limits, request_id, None
        )

    async def settle(self, outcome: RequestOutcome) -> None:
        """Settle the request's reservation with what it really used."""
        if outcome.expired:
            return  # the store expires the reservation itself (slot freed, charge kept)
        decision = outcome.decision
        if not decision.charged_here:
            return  # its origin settles it from its own access log
        actual = settled_charge(outcome)
        limits = decision.limits or decision.caller.limits
        try:
            settled = await self._store.settle(
                decision.caller.budget_id, limits, outcome.tracking_id, actual
            )
        except Exception:
            log.exception("settling %s failed; the reservation will expire", outcome.tracking_id)
            return
        if settled and actual is not None:
            self._events.tokens_settled(decision, actual)
            if self._demand is not None:  # counted only for a tenant it counted demand of
                self._demand.settled(decision.caller.tenant, actual.weighted_tokens)
