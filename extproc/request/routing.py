"""Where a counted request goes and what it is charged: pure functions of the policy.

What lives here: `route` (a counted request's decision: its charged output limit, context
bucket and pool, or a refusal when it cannot fit the model's window), `request_decision`
(a request counted as one request and no tokens), `charged_max_tokens` and
`engine_priority`. The request flow (extproc.request.flow) and the candidate judge
(extproc.request.candidate) route with them; the simulator asks `engine_priority` too.
"""

from __future__ import annotations

from admission.decision import CountKind, RoutingDecision
from admission.errors import ContextLengthExceeded, Overloaded
from extproc.request.bodies.request import InferenceRequest
from extproc.request.tokens.prompt import PromptCount
from policy.apis import Api, BodyShape
from policy.domain import ApiKey, Tier
from policy.schema import Policy

# What vLLM (and OpenAI's legacy API) generate for a completion that names no max_tokens.
COMPLETION_DEFAULT_MAX_TOKENS = 16


def route(
    policy: Policy,
    request: InferenceRequest,
    caller: ApiKey,
    request_id: str,
    api: Api,
    counted: PromptCount,
    correction: float = 1.0,
    body_bytes: int = 0,
) -> RoutingDecision:
    """The decision for a counted request: its charged limit, bucket and pool, or a refusal
    when it cannot fit the model's window. `body_bytes`: its body's size (the waiting
    room's byte bound), where there is one."""
    prompt_tokens = counted.tokens
    max_tokens = charged_max_tokens(request, policy, prompt_tokens)
    context = prompt_tokens + max_tokens
    if context > policy.max_context_tokens and counted.kind is CountKind.BUSY:
        # The byte bound says it may not fit, but only a count could say it does not.
        raise Overloaded(
            "The gateway is too busy to count this request's prompt right now. "
            "Please retry shortly.",
            reason="token_count_busy",
            retry_after_s=1,
        )
    if context > policy.max_context_tokens:
        counted_how = (
            f" (The prompt is over {policy.counting.max_bytes} bytes, which this gateway "
            "does not count: it is taken at one token per byte, the most it can hold.)"
            if counted.kind is CountKind.BOUND
            else ""
        )
        raise ContextLengthExceeded(
            f"This model's maximum context length is {policy.max_context_tokens} tokens. "
            f"However, you requested {context} tokens "
            f"({prompt_tokens} in the messages, {max_tokens} in the completion). "
            f"Please reduce the length of the messages or completion.{counted_how}",
            reason="context_length_exceeded",
        )
    return RoutingDecision(
        request_id=request_id,
        caller=caller,
        pool=policy.pool_for(context),
        bucket=policy.bucket_for(context),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        estimate=counted.kind,
        stream=request.stream,
        api=api,
        sequences=request.sequences,
        runs_to_limit=request.runs_to_limit,
        prompt_correction=correction,
        body_bytes=body_bytes,
    )


def request_decision(policy: Policy, api: Api, caller: ApiKey, request_id: str) -> RoutingDecision:
    """A request counted as one request and no tokens, on the default pool."""
    return RoutingDecision(
        request_id=request_id,
        caller=caller,
        pool=policy.default_pool,
        bucket=policy.bucket_for(0),
        prompt_tokens=0,
        max_tokens=0,
        estimate=CountKind.EXACT,
        stream=False,
        api=api,
    )


# vLLM's priority scheduling runs lower values first; the tier is the only authority.
_ENGINE_PRIORITY = {Tier.CRITICAL: 0, Tier.STANDARD: 1, Tier.SHEDDABLE: 2}


def engine_priority(tier: Tier) -> int:
    return _ENGINE_PRIORITY[tier]


def charged_max_tokens(request: InferenceRequest, policy: Policy, prompt_tokens: int) -> int:
    """Each completion's output limit: the one the request names; for completions without
    one, the 16 tokens the engine generates then; otherwise the policy's default, cut to
    what the model's window leaves after the prompt (it is written into the forwarded body,
    so the engine cannot generate more than was charged)."""
    if not request.generates:
        return 0
    if request.max_tokens is not None:
        return request.max_tokens
    if request.shape is BodyShape.COMPLETION:
        return COMPLETION_DEFAULT_MAX_TOKENS
    return max(1, min(policy.default_max_tokens, policy.max_context_tokens - prompt_tokens))
