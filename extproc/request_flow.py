"""What slogate decides for one inference request, phase by phase, without any gRPC.

What lives here: `Decider` (shared, one per sidecar) and `RequestFlow` (one per Envoy
stream). The flow turns request headers into a `HeaderVerdict` and the buffered body into a
`RoutingDecision`, or raises a `RequestRejected`. Protobuf building and metrics live
elsewhere (extproc.responses, extproc.server), so this can be unit-tested with plain dicts.

Admission control (budgets, breaker) plugs in through `Admission`: it is consulted after
the route is known and before the decision is returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from extproc.bodies import InferenceRequest, adds_usage, parse_inference_body, rewritten_body
from extproc.contract import POOL_HEADER, SLOGATE_HEADER_PREFIX
from extproc.errors import (
    BodyTooLarge,
    ContextLengthExceeded,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    RequestRejected,
)
from extproc.identity import IdentityResolver
from extproc.inflight import InFlight
from extproc.tokens import CountKind, PromptCorrections, PromptCount, PromptCounter
from policy import ApiKey, ContextBucket, Policy
from policy.apis import KNOWN_APIS, Api, ApiKind, BodyShape, ErrorStyle, PathClass, error_style_for

_CHAT_API = KNOWN_APIS[0]
# What vLLM (and OpenAI's legacy API) generate for a completion that names no max_tokens.
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    request_id: str
    caller: ApiKey
    pool: str
    bucket: ContextBucket
    prompt_tokens: int
    max_tokens: int  # per completion: what the request was charged for (and may generate)
    estimate: CountKind  # how prompt_tokens was counted
    stream: bool
    model_override: str | None = None  # the breaker's fallback model at L3
    api: Api = _CHAT_API
    sequences: int = 1  # completions generated at once (n, best_of, beam width, batch)
    runs_to_limit: bool = False  # generates max_tokens whatever the model does (ignore_eos)
    # The caller's prompt correction that prompt_tokens includes (extproc.tokens.corrections).
    prompt_correction: float = 1.0

    @property
    def exact(self) -> bool:
        return self.estimate in (CountKind.EXACT, CountKind.CACHED)

    @property
    def context_tokens(self) -> int:
        """One completion's context: what the model window holds, and what picks the bucket
        and the pool."""
        return self.prompt_tokens + self.max_tokens

    @property
    def reserved_tokens(self) -> int:
        """Everything the request can make the engine hold and generate: the prompt once
        (the completions share it) plus each completion's limit."""
        return self.prompt_tokens + self.sequences * self.max_tokens

    @property
    def meters_tokens(self) -> bool:
        """False for the cheap APIs (tokenize, model list): one request, no tokens, no KV."""
        return self.api.kind is not ApiKind.REQUEST

    def upstream_headers(self) -> dict[str, str]:
        return {
            POOL_HEADER: self.pool,
            "x-slogate-tenant": self.caller.tenant,
            "x-slogate-tier": self.caller.tier.value,
            "x-slogate-bucket": self.bucket.name,
            "x-slogate-est-tokens": str(self.context_tokens),
        }


@dataclass(frozen=True, slots=True)
class Admitted:
    """Admission's answer: the decision (maybe re-routed) and headers for the client."""

    decision: RoutingDecision
    response_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Routed:
    """The body phase's answer: the decision, its in-flight id and the new body, if any."""

    decision: RoutingDecision
    tracking_id: str  # comes back in the access log; see extproc.inflight
    new_body: bytes | None = field(default=None, repr=False)
    # Rendered by Envoy on the response from dynamic metadata (no extra round trip).
    response_headers: Mapping[str, str] = field(default_factory=dict)
    # slogate asked the stream for its usage itself: the Lua tap hides it from the client.
    hide_usage: bool = False


@dataclass(frozen=True, slots=True)
class HeaderVerdict:
    """The header phase's answer. `routed` is set when the request was admitted already
    (an API whose body is not read: its route and tracking id go out with the headers)."""

    inference: bool  # the body phase follows
    strip_headers: tuple[str, ...]  # client-supplied x-slogate-* headers
    caller: ApiKey | None
    request_id: str
    routed: Routed | None = None


class Admission(Protocol):
    """Budgets and breakers: admit (maybe changing the pool) or raise a RequestRejected.

    `reservation_id` is the request's in-flight id: whatever admission holds for the
    request is released under that id when its outcome comes back.
    """

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted: ...


class AdmitAll:
    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        return Admitted(decision)


class Releasing(Protocol):
    """An admission step that holds something (a KV footprint) until the request ends."""

    async def release(self, decision: RoutingDecision, reservation_id: str) -> None: ...


class AdmissionChain:
    """Admission steps in order (breaker before budgets: a shed request spends nothing).

    When a step refuses, the steps before it that hold something give it back: a request
    refused by its budget must not keep KV room it will never use.
    """

    def __init__(self, steps: Sequence[Admission]) -> None:
        # Which steps hold something is known once, not looked up per request.
        self._steps = [
            (step, cast(Releasing, step) if hasattr(step, "release") else None) for step in steps
        ]

    async def admit(self, decision: RoutingDecision, reservation_id: str) -> Admitted:
        headers: dict[str, str] = {}
        holding: list[tuple[Releasing, RoutingDecision]] = []
        for admission, releasing in self._steps:
            try:
                admitted = await admission.admit(decision, reservation_id)
            except RequestRejected:
                for step, held in reversed(holding):
                    await step.release(held, reservation_id)
                raise
            decision = admitted.decision
            headers.update(admitted.response_headers)
            if releasing is not None:
                holding.append((releasing, decision))
        return Admitted(decision, headers)


class Decider:
    """Everything a decision needs that outlives one request."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        identity: IdentityResolver,
        counter: PromptCounter,
        admission: Admission | None = None,
        inflight: InFlight[RoutingDecision] | None = None,
        corrections: PromptCorrections | None = None,
    ) -> None:
        self.policy = policy
        self.identity = identity
        self.counter = counter
        self.corrections = corrections or PromptCorrections()
        self.admission: Admission = admission or AdmitAll()
        # Decisions wait here for their access-log entry; expired after the upstream timeout.
        self.inflight: InFlight[RoutingDecision] = inflight or InFlight(
            time.monotonic, policy().upstream_timeout_s + 60.0
        )

    def new_flow(self) -> RequestFlow:
        return RequestFlow(self)

    async def count_prompt(
        self, request: InferenceRequest, caller: ApiKey
    ) -> tuple[PromptCount, float]:
        """Prompt tokens (see extproc.tokens.prompt for the rule and its bound), times the
        caller's correction when its settled prompts keep exceeding its counts; and that
        correction."""
        counted = await self.counter.count(request.prompt_texts, request.prompt_token_ids)
        factor = self.corrections.factor(caller.key_id)
        if factor == 1.0 or not counted.exact:
            return counted, 1.0
        return PromptCount(math.ceil(counted.tokens * factor), counted.kind), factor


class RequestFlow:
    """One Envoy stream: headers first, then (for APIs whose body is read) the buffered body.

    The header phase classifies the path under the policy: public (forwarded as it is),
    an enabled API (identity required), or unknown (404: default deny). APIs whose body is
    not read (tokenize, the model list) are admitted right there, as one request each.
    """

    def __init__(self, decider: Decider) -> None:
        self._decider = decider
        self._api: Api | None = None
        self._verdict: HeaderVerdict | None = None
        self.error_style = ErrorStyle.OPENAI

    @property
    def request_id(self) -> str:
        return self._verdict.request_id if self._verdict is not None else ""

    @property
    def tenant(self) -> str | None:
        caller = self._verdict.caller if self._verdict is not None else None
        return caller.tenant if caller is not None else None

    async def on_request_headers(
        self,
        headers: Mapping[str, str],
        end_of_stream: bool,
        claims: Mapping[str, Any] | None = None,
    ) -> HeaderVerdict:
        policy = self._decider.policy()
        path = headers.get(":path", "")
        self.error_style = error_style_for(path)
        strip = tuple(h for h in headers if h.startswith(SLOGATE_HEADER_PREFIX))
        request_id = headers.get("x-request-id", "")
        kind, api = policy.paths.classify(path)
        if kind is PathClass.PUBLIC:
            self._verdict = HeaderVerdict(False, strip, None, request_id)
            return self._verdict
        if api is None:
            raise NotFound(
                "Unknown request URL. This gateway serves the inference APIs its policy "
                "lists; see its documentation.",
                reason="unknown_path",
            )
        self._api = api
        caller = self._decider.identity.resolve(headers, claims)
        method = headers.get(":method", "POST")
        if method not in api.methods:
            allowed = ", ".join(sorted(api.methods))
            raise MethodNotAllowed(
                f"{method} is not supported on {api.path}; use {allowed}.",
                reason="method_not_allowed",
                headers={"allow": allowed},
            )
        if not api.reads_body:
            decision = self._request_decision(policy, api, caller, request_id)
            routed = await self._admit(decision, None, None)
            self._verdict = HeaderVerdict(False, strip, caller, request_id, routed)
            return self._verdict
        if end_of_stream:
            raise InvalidRequest("The request has no body.", reason="missing_body")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > policy.max_body_bytes:
            raise _too_large(int(declared), policy)
        self._verdict = HeaderVerdict(True, strip, caller, request_id)
        return self._verdict

    async def on_request_body(self, body: bytes) -> Routed:
        verdict = self._verdict
        api = self._api
        if verdict is None or not verdict.inference or verdict.caller is None or api is None:
            raise InvalidRequest("Request body without an inference request.", reason="protocol")
        assert api.shape is not None
        policy = self._decider.policy()
        if len(body) > policy.max_body_bytes:
            raise _too_large(len(body), policy)
        request = parse_inference_body(api.shape, body)
        if request.sequences > policy.max_sequences:
            raise InvalidRequest(
                f"This request asks for {request.sequences} completions at once (n, best_of "
                f"or a batch of prompts); this gateway allows at most {policy.max_sequences}.",
                reason="too_many_sequences",
            )
        counted, correction = await self._decider.count_prompt(request, verdict.caller)
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
        decision = RoutingDecision(
            request_id=verdict.request_id,
            caller=verdict.caller,
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
        )
        return await self._admit(decision, request, body)

    def _request_decision(
        self, policy: Policy, api: Api, caller: ApiKey, request_id: str
    ) -> RoutingDecision:
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

    async def _admit(
        self, decision: RoutingDecision, request: InferenceRequest | None, body: bytes | None
    ) -> Routed:
        inflight = self._decider.inflight
        tracking_id = inflight.new_id()
        admitted = await self._decider.admission.admit(decision, tracking_id)
        inflight.put(tracking_id, admitted.decision)
        new_body = None
        if request is not None and body is not None:
            written = admitted.decision.max_tokens if request.max_tokens is None else None
            new_body = rewritten_body(body, request, written, admitted.decision.model_override)
        hide_usage = request is not None and adds_usage(request)
        headers = admitted.response_headers
        return Routed(admitted.decision, tracking_id, new_body, headers, hide_usage)


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


def _too_large(size_bytes: int, policy: Policy) -> BodyTooLarge:
    return BodyTooLarge(
        f"Request body is {size_bytes} bytes; the limit is {policy.max_body_bytes} bytes.",
        reason="body_too_large",
    )
