"""Whether a caller may send a request at all: its tenant suspended, a limit of its set to 0,
a pool its tenant may not use (policy `tenants:`). Each is a 403 that names the tenant and
what bars it (admission.errors.Forbidden), given before anything is spent: a shed, a wait or
a 429 would tell the client to retry, and retrying will not help.

What lives here: `check_caller` (what bars every request of a caller: the header phase runs
it, so a suspended tenant's body is never read), `check_request` (a routed request: that,
plus what bars only some requests) and `AccessStep`, the admission chain's first step, which
runs `check_request` on every request the chain admits. Pure; the policy decides. Only new
requests are judged: a tenant suspended while its requests run lets them finish.
"""

from __future__ import annotations

from admission.decision import Admitted, Applicant, RequestOutcome, RoutingDecision
from admission.errors import LimitZero, PoolNotAllowed, TenantSuspended
from policy.domain import ApiKey, Limits
from policy.schema import Policy

# A limit of 0 on these bars every request; on the token limits, every one that meters tokens.
_EVERY_REQUEST = ("requests_per_minute", "concurrent_requests")
_TOKEN_REQUESTS = ("tokens_per_minute", "tokens_per_hour", "max_context_tokens")


def _zero_limit(limits: Limits, names: tuple[str, ...]) -> str | None:
    for name in names:  # a loop, not a generator: three times on every request
        if getattr(limits, name) == 0:
            return name
    return None


def check_caller(policy: Policy, caller: ApiKey) -> None:
    """Refuse a caller none of whose requests may pass: its tenant suspended, or a limit of
    0 on requests or on concurrency."""
    tenant = policy.tenants.get(caller.tenant)
    if tenant is not None and tenant.suspended:
        raise TenantSuspended(
            f"Tenant {caller.tenant!r} is suspended on this gateway: its requests are "
            "refused. Ask the gateway's operator to restore it.",
            reason="tenant_suspended",
        )
    zero = _zero_limit(caller.limits, _EVERY_REQUEST)
    if zero is not None:
        raise _limit_zero(caller, zero, "requests")


def check_request(policy: Policy, decision: RoutingDecision) -> None:
    """Refuse a routed request its caller may not send: `check_caller`'s reasons, a token
    limit of 0 on a request that meters tokens, or a pool its tenant may not use. The pool
    judged is the one the request's route picks; the breaker's re-route to the fallback pool
    (L3) is the operator's degradation path and stays open to every tenant."""
    caller = decision.caller
    check_caller(policy, caller)
    if not decision.meters_tokens:
        return  # the model list, tokenize: one cheap request on the default pool
    zero = _zero_limit(caller.limits, _TOKEN_REQUESTS)
    if zero is not None:
        raise _limit_zero(caller, zero, "inference requests")
    tenant = policy.tenants.get(caller.tenant)
    if tenant is not None and tenant.pools is not None and decision.pool not in tenant.pools:
        allowed = ", ".join(sorted(tenant.pools))
        raise PoolNotAllowed(
            f"Tenant {caller.tenant!r} may not use the {decision.pool!r} pool, where this "
            f"request's {decision.context_tokens} tokens of context (prompt + max_tokens) "
            f"are routed; it may use: {allowed}.",
            reason="pool_not_allowed",
        )


class AccessStep:
    """The chain's first step (admission.assembly): a request its caller may not send is
    refused before any other step takes or sheds anything. It holds nothing."""

    async def admit(self, applicant: Applicant) -> Admitted:
        check_request(applicant.policy, applicant.decision)
        return Admitted(applicant.decision)

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        pass

    async def settle(self, outcome: RequestOutcome) -> None:
        pass


def _limit_zero(caller: ApiKey, name: str, what: str) -> LimitZero:
    return LimitZero(
        f"This API key's {name} limit is 0 (tenant {caller.tenant!r}): it may not send "
        f"{what}. Ask the gateway's operator to raise it.",
        reason="limit_zero",
    )
