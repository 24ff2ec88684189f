"""Decisions and outcomes for tests of the admission steps, settlement, the sinks and the
request's observers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admission.decision import CountKind, RequestOutcome, RoutingDecision
from policy.domain import ApiKey, Limits, Tier
from policy.loader import parse_policy
from policy.schema import Policy

POLICY = parse_policy({})


def caller(
    tier: Tier = Tier.STANDARD, tenant: str = "t", limits: Limits | None = None, key: str = "k1"
) -> ApiKey:
    return ApiKey(key * 32, tenant, tier, limits or Limits())


def decision(
    context_tokens: int = 1000,
    max_tokens: int = 100,
    tier: Tier = Tier.STANDARD,
    policy: Policy = POLICY,
    **fields: Any,
) -> RoutingDecision:
    """A routed decision of `context_tokens` (prompt + max_tokens), bucket and pool as the
    policy would give them; any field can be overridden."""
    values: dict[str, Any] = {
        "request_id": "rid",
        "caller": caller(tier),
        "pool": policy.pool_for(context_tokens),
        "bucket": policy.bucket_for(context_tokens),
        "prompt_tokens": context_tokens - max_tokens,
        "max_tokens": max_tokens,
        "estimate": CountKind.EXACT,
        "stream": False,
    }
    values.update(fields)
    return RoutingDecision(**values)


def outcome(
    routed: RoutingDecision,
    tracking_id: str = "r1",
    status: int = 200,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = 10,
    **fields: Any,
) -> RequestOutcome:
    values: dict[str, Any] = {
        "decision": routed,
        "tracking_id": tracking_id,
        "status": status,
        "prompt_tokens": routed.prompt_tokens if prompt_tokens is None else prompt_tokens,
        "completion_tokens": completion_tokens,
        "ttft_s": 0.1,
        "duration_s": 1.0,
        "details": "via_upstream",
    }
    values.update(fields)
    return RequestOutcome(**values)


@dataclass
class Seen:
    """A request as an observer sees it (extproc.service.observers.RequestSeen), without a
    request flow: its id, caller, shape and arrival."""

    request_id: str
    caller: ApiKey | None = None
    shape: RoutingDecision | None = None
    arrived_s: float = 0.0
    trace_parent: Any = None
