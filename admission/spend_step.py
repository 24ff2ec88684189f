"""Spend budgets per tenant as an admission step: reserve on the request, settle on usage.

What lives here: `SpendStep`, which charges the request's tenant (every key of a tenant,
and every JWT caller naming it, shares one budget) in each calendar window its `spend:`
sets — reserved at the request's largest cost, settled on what the engine reports, each
token kind at its price (budget.spend) — and refuses with 429 `insufficient_quota`
(admission.errors.SpendExhausted, Retry-After until the window ends) once a window is used
up; `SpendEvents`, what it reports; `spend_usage`, what a finished request used; and the
warning header (`x-slogate-spend-warning: month=80%`) on admitted requests.

A stream admitted under the limit is never cut: it settles what it really used, even past
the limit, and the next request is refused.

A check the store does not answer within its own timeout (`budget.spend_timeout_ms`,
longer than the token budgets': a day's or a month's total cannot be rebuilt from local
shares the way a per-minute bucket can, so there is nothing to fall back on) leaves the
request's reservation unknown: the command was sent and may still land. The policy's
`budget.spend_unverified` says what the request gets:
- `admit` (the default): it runs, and is settled unverified when it ends (budget.spend.
  settle_unverified): what it spent counts once, whether its reservation landed or not. A
  settlement the store cannot take yet waits in the backlog (budget.spend_backlog),
  retried each `reconcile` until the store answers. The tenant may pass its limit by what
  was admitted while the store was slow; the next requests see it.
- `refuse`: a 503 `spend_unverified` with Retry-After; the steps before give back what they
  hold (the chain), and its own reservation, should it land late, is refunded from the
  backlog.
Either way it is counted (`SpendEvents.spend_unverified`), and the decision log says so.

A tenant whose scope is global has one spend budget worldwide: this region's limit in each
window is what the region spent plus its share of what the world has left, as of its lease
(admission.regions.RegionShares.spend_limit); the store checks against that.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from admission.decision import (
    SPEND_WARNING_HEADER,
    Admitted,
    Applicant,
    RequestOutcome,
    RoutingDecision,
)
from admission.errors import SpendExhausted, SpendUnverified
from admission.regions import RegionShares, global_tenant
from budget.spend import (
    WARNING_SHARES,
    SpendHold,
    SpendWindow,
    TokenUsage,
    reserved_cost,
    windows,
)
from budget.spend_backlog import PendingSettlement, SpendBacklog, settle
from budget.spend_store import SpendStore
from budget.store import BudgetStoreError
from policy.schema import UnverifiedSpend

log = logging.getLogger("slogate.spend")
_ADJECTIVE = {"day": "daily", "month": "monthly"}


class SpendEvents(Protocol):
    def spend_used(self, tenant: str, window: str, share: float, before: float) -> None:
        """A window's used share (spent + held over its limit) moved from `before`."""
        ...

    def spend_unverified(self, tenant: str, action: str, cause: str) -> None:
        """A check the store did not answer: `action` admitted or refused, `cause` timeout
        (slower than the spend timeout) or error (away)."""
        ...

    def spend_backlog(self, waiting: int, settled: int, lost: int) -> None:
        """The settlements waiting for the store, and how many it took or were given up."""
        ...


def spend_usage(outcome: RequestOutcome) -> TokenUsage | None:
    """What a finished request used, by kind; None refunds it. Like the key budgets
    (admission.budget_step.settled_charge): the engine's usage; without it, a stream cut
    early is charged its prompt and one token per event sent, an upstream error refunds,
    any other success keeps its reservation."""
    decision = outcome.decision
    prompt = outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens
    if outcome.completion_tokens is not None:
        return TokenUsage(
            prompt,
            outcome.completion_tokens,
            outcome.cached_prompt_tokens or 0,
            outcome.reasoning_tokens or 0,
        )
    if outcome.stream_events:
        return TokenUsage(
            prompt, min(outcome.stream_events, decision.sequences * decision.max_tokens)
        )
    if outcome.status >= 400 or outcome.status == 0:
        return None
    return TokenUsage(decision.prompt_tokens, decision.sequences * decision.max_tokens)


def warning_header(shares: Mapping[str, float]) -> dict[str, str]:
    """`x-slogate-spend-warning: day=100%, month=80%`: the highest warning share each window
    has reached; nothing while every window is under the first."""
    reached = []
    for name, share in shares.items():
        passed = [w for w in WARNING_SHARES if share >= w]
        if passed:
            reached.append(f"{name}={round(max(passed) * 100)}%")
    return {SPEND_WARNING_HEADER: ", ".join(reached)} if reached else {}


# A window's limit in a region holding none of it: above 0, as the used shares divide by it.
_NO_ALLOWANCE = 1e-9


def _regional(
    shares: RegionShares, tenant: str, spans: tuple[SpendWindow, ...]
) -> tuple[SpendWindow, ...]:
    """A global tenant's windows with this region's limits in them."""
    regional = []
    for span in spans:
        limit = shares.spend_limit(tenant, span.id, span.limit)
        if limit is not None:
            span = dataclasses.replace(span, limit=max(_NO_ALLOWANCE, min(span.limit, limit)))
        regional.append(span)
    return tuple(regional)


def _places(unit: str) -> int:
    """Dollars to the cent, tokens whole."""
    return 2 if unit == "usd" else 0


def _resets(span: SpendWindow) -> str:
    return dt.datetime.fromtimestamp(span.ends_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SpendStep:
    def __init__(
        self,
        store: SpendStore,
        events: SpendEvents,
        ttl_s: float,
        wall_clock: Callable[[], float],
        shares: RegionShares | None = None,
    ) -> None:
        """`shares`: this region's part of each global tenant's spend (None: one region)."""
        self._store = store
        self._events = events
        self._ttl_s = ttl_s  # a reservation outlives the longest request by this
        self._wall_clock = wall_clock  # UTC time: which day and month a request falls in
        self._shares = shares
        self.backlog = SpendBacklog()
        # The store failed its last call: one warning an outage, not one a request.
        self._unanswered = False

    async def admit(self, applicant: Applicant) -> Admitted:
        decision, policy = applicant.decision, applicant.policy
        caller = decision.caller
        tenant = policy.tenants.get(caller.tenant)
        # Nothing to charge here: no spend budget, a cheap API, or a request crossed from
        # the region that charged it (its hold stays None, so settling is a no-op too).
        if (
            tenant is None
            or tenant.spend is None
            or not decision.meters_tokens
            or not decision.charged_here
        ):
            return Admitted(decision)
        now_s = self._wall_clock()
        spans = windows(tenant.spend.windows(), now_s)
        if self._shares is not None and global_tenant(policy, caller.tenant):
            spans = _regional(self._shares, caller.tenant, spans)
        per_token = policy.tenants.prices.per_token(tenant.spend.unit)
        amount = reserved_cost(
            decision.prompt_tokens, decision.sequences * decision.max_tokens, per_token
        )
        hold = SpendHold(caller.tenant, spans, per_token, amount)
        try:
            verdict = await self._store.reserve(hold, applicant.request_id, self._ttl_s)
        except BudgetStoreError as error:
            return self._unverified(applicant, hold, error)
        self._answered()
        shares = {s.name: verdict.used[s.id] / s.limit for s in spans}
        for span in spans:
            before = (verdict.used[span.id] - (amount if verdict.admitted else 0)) / span.limit
            self._events.spend_used(caller.tenant_label, span.name, shares[span.name], before)
        if not verdict.admitted:
            span = verdict.refused or spans[0]
            unit = tenant.spend.unit.value
            raise SpendExhausted(
                f"Tenant {caller.tenant!r} has used its {_ADJECTIVE[span.name]} spend budget "
                f"({verdict.used[span.id]:,.{_places(unit)}f} of "
                f"{span.limit:,.{_places(unit)}f} {unit}); it resets at "
                f"{_resets(span)} (the {span.name} in UTC). Ask the gateway's operator "
                "to raise it, or retry then.",
                reason="spend_exhausted",
                retry_after_s=max(1, math.ceil(span.ends_s - now_s)),
                headers={SPEND_WARNING_HEADER: f"{span.name}=100%"},
            )
        return Admitted(dataclasses.replace(decision, spend=hold), warning_header(shares))

    def _unverified(
        self, applicant: Applicant, hold: SpendHold, error: BudgetStoreError
    ) -> Admitted:
        """The check went unanswered: admit the request unverified, or refuse it, as the
        policy says."""
        decision, caller = applicant.decision, applicant.decision.caller
        cause = "timeout" if isinstance(error.__cause__, TimeoutError) else "error"
        unverified = dataclasses.replace(hold, verified=False)
        if applicant.policy.budget.spend_unverified is UnverifiedSpend.ADMIT:
            self._failed(f"spend checks unanswered, admitted unverified: {error}")
            self._events.spend_unverified(caller.tenant_label, "admitted", cause)
            return Admitted(dataclasses.replace(decision, spend=unverified))
        self._failed(f"spend checks unanswered, refused (spend_unverified): {error}")
        self._events.spend_unverified(caller.tenant_label, "refused", cause)
        # Its reservation may land once the store answers: refunded then, from the backlog
        # (not here: that would wait another timeout before the client hears of it).
        self._later(unverified, applicant.request_id, None)
        raise SpendUnverified(
            f"Tenant {caller.tenant!r}'s spend budget could not be checked in time (the "
            "spend store is slow or unreachable), and this gateway refuses what it cannot "
            "check. Retry shortly.",
            reason="spend_unverified",
            retry_after_s=1,
        )

    def _failed(self, message: str) -> None:
        if not self._unanswered:
            log.warning("%s", message)
        self._unanswered = True

    def _answered(self) -> None:
        if self._unanswered:
            log.warning("spend store answers again")
        self._unanswered = False

    def _later(self, hold: SpendHold, request_id: str, actual: float | None) -> None:
        """Into the backlog, tried until half the reservation's ttl has passed (well inside
        the ttl of the marker an unverified settlement leaves, on the store's clock)."""
        deadline_s = self._wall_clock() + self._ttl_s / 2
        self.backlog.add(PendingSettlement(hold, request_id, actual, deadline_s, self._ttl_s))

    async def reconcile(self) -> None:
        """Retry the settlements the store could not take (the sidecar's periodic loop)."""
        drained = await self.backlog.drain(self._store, self._wall_clock())
        self._events.spend_backlog(drained.waiting, drained.settled, drained.lost)

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """A later step refused, or the request died: the reservation is refunded."""
        hold = decision.spend
        if hold is not None:
            await self._settled(decision, hold, request_id, None)

    async def settle(self, outcome: RequestOutcome) -> None:
        hold = outcome.decision.spend
        if hold is None:
            return
        if outcome.expired:
            if hold.verified:
                return  # an expired reservation stays spent in the store by itself
            # Its reservation may never have landed: charged what it reserved, as it would be.
            await self._settled(outcome.decision, hold, outcome.tracking_id, hold.amount)
            return
        usage = spend_usage(outcome)
        actual = None if usage is None else usage.cost(hold.per_token)
        await self._settled(outcome.decision, hold, outcome.tracking_id, actual)

    async def _settled(
        self, decision: RoutingDecision, hold: SpendHold, request_id: str, actual: float | None
    ) -> None:
        try:
            used = await settle(self._store, hold, request_id, actual, self._ttl_s)
        except BudgetStoreError as error:
            self._failed(f"spend settlements fail, retried each second: {error}")
            self._later(hold, request_id, actual)
            return
        if used is None:
            return
        # An unverified hold's reservation may never have landed: all it spent is new.
        change = (actual or 0.0) - (hold.amount if hold.verified else 0.0)
        for span in hold.spans:
            share = used[span.id] / span.limit
            before = share - change / span.limit
            self._events.spend_used(decision.caller.tenant_label, span.name, share, before)
