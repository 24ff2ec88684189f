"""What slogate decides for one inference request, phase by phase, without any gRPC.

What lives here: `Decider` (shared, one per sidecar) and `RequestFlow` (one per Envoy
stream). The flow turns request headers into a `HeaderVerdict` and the buffered body into a
`RoutingDecision`, or raises a `RequestRejected`. Protobuf building and metrics live
elsewhere (extproc.responses, extproc.server), so this can be unit-tested with plain dicts.

Admission control (budgets, breaker) plugs in through `Admission`: it is consulted after
the route is known and before the decision is returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast

from extproc.contract import POOL_HEADER, SLOGATE_HEADER_PREFIX
from extproc.errors import (
    BodyTooLarge,
    ContextLengthExceeded,
    InvalidRequest,
    MethodNotAllowed,
    RequestRejected,
)
from extproc.identity import IdentityResolver
from extproc.inflight import InFlight
from extproc.openai_request import (
    INFERENCE_PATHS,
    InferenceRequest,
    parse_inference_body,
    with_model,
    with_usage_requested,
)
from extproc.tokens import TokenEstimator, near_threshold
from policy import ApiKey, ContextBucket, Policy

# Exact counts queued or running at once; past this the estimate decides. At the largest
# prompt counted exactly (exact_max_bytes, ~64k tokens, ~130 ms) two fit well inside the
# default 1 s message timeout.
MAX_EXACT_PENDING = 2


class EstimateKind(StrEnum):
    UPPER_BOUND = "upper_bound"  # clearly below every threshold: the cheap bound decided
    FITTED = "fitted"  # the fitted byte-class estimate
    EXACT = "exact"  # the real tokenizer


@dataclass(frozen=True, slots=True)
class HeaderVerdict:
    inference: bool  # the body phase follows
    strip_headers: tuple[str, ...]  # client-supplied x-slogate-* headers
    caller: ApiKey | None
    request_id: str


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    request_id: str
    caller: ApiKey
    pool: str
    bucket: ContextBucket
    prompt_tokens: int
    max_tokens: int
    estimate: EstimateKind  # how prompt_tokens was counted
    stream: bool
    model_override: str | None = None  # the breaker's fallback model at L3

    @property
    def exact(self) -> bool:
        return self.estimate is EstimateKind.EXACT

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens

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
        estimator: TokenEstimator,
        exact_executor: Executor | None = None,
        admission: Admission | None = None,
        inflight: InFlight[RoutingDecision] | None = None,
    ) -> None:
        self.policy = policy
        self.identity = identity
        self.estimator = estimator
        self.exact_executor = exact_executor  # None: never count exactly
        self._exact_pending = 0
        self.admission: Admission = admission or AdmitAll()
        # Decisions wait here for their access-log entry; expired after the upstream timeout.
        self.inflight: InFlight[RoutingDecision] = inflight or InFlight(
            time.monotonic, policy().upstream_timeout_s + 60.0
        )

    def new_flow(self) -> RequestFlow:
        return RequestFlow(self)

    async def count_prompt(
        self, request: InferenceRequest, policy: Policy
    ) -> tuple[int, EstimateKind]:
        """Prompt tokens, and how they were counted.

        Three steps, each only when the one before cannot settle the decision:
        - an upper bound (a few µs): when even the bound keeps the context clearly below
          every threshold, the decision is the one the estimate would give;
        - the fitted estimate (numpy, O(bytes));
        - the real tokenizer, off the event loop, when the context lands within
          `exact_margin` of a threshold where one token changes the answer (bucket edge,
          pool rule, model max), for prompts up to `exact_max_bytes`.
        """
        max_tokens = request.max_tokens or policy.default_max_tokens
        bound = self.estimator.upper_bound_messages(request.prompt_texts)
        bound += request.prompt_token_ids
        lowest = policy.decision_thresholds[0] if policy.decision_thresholds else 0
        if bound + max_tokens < lowest * (1.0 - policy.exact_margin):
            return bound, EstimateKind.UPPER_BOUND
        estimate = self.estimator.estimate_messages(request.prompt_texts)
        estimate += request.prompt_token_ids
        context = estimate + max_tokens
        if (
            self.exact_executor is None
            or not request.prompt_texts
            or request.prompt_chars > policy.exact_max_bytes
            # A queue of exact counts would outlast Envoy's message timeout: decide on the
            # estimate rather than let a burst of near-threshold prompts time out.
            or self._exact_pending >= MAX_EXACT_PENDING
            or not near_threshold(context, policy.decision_thresholds, policy.exact_margin)
        ):
            return estimate, EstimateKind.FITTED
        loop = asyncio.get_running_loop()
        self._exact_pending += 1
        try:
            exact = await loop.run_in_executor(
                self.exact_executor, self.estimator.count_exact, request.prompt_texts
            )
        finally:
            self._exact_pending -= 1
        return exact + request.prompt_token_ids, EstimateKind.EXACT


class RequestFlow:
    """One Envoy stream: headers first, then (for inference paths) the buffered body."""

    def __init__(self, decider: Decider) -> None:
        self._decider = decider
        self._path = ""
        self._verdict: HeaderVerdict | None = None

    @property
    def request_id(self) -> str:
        return self._verdict.request_id if self._verdict is not None else ""

    @property
    def tenant(self) -> str | None:
        caller = self._verdict.caller if self._verdict is not None else None
        return caller.tenant if caller is not None else None

    def on_request_headers(
        self,
        headers: Mapping[str, str],
        end_of_stream: bool,
        claims: Mapping[str, Any] | None = None,
    ) -> HeaderVerdict:
        policy = self._decider.policy()
        path = headers.get(":path", "").split("?", 1)[0]
        strip = tuple(h for h in headers if h.startswith(SLOGATE_HEADER_PREFIX))
        request_id = headers.get("x-request-id", "")
        if path not in INFERENCE_PATHS:
            self._verdict = HeaderVerdict(False, strip, None, request_id)
            return self._verdict
        self._path = path
        caller = self._decider.identity.resolve(headers, claims)
        if headers.get(":method", "POST") != "POST":
            raise MethodNotAllowed(
                f"Only POST is supported on {path}.", reason="method_not_allowed"
            )
        if end_of_stream:
            raise InvalidRequest("The request has no body.", reason="missing_body")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > policy.max_body_bytes:
            raise _too_large(int(declared), policy)
        self._verdict = HeaderVerdict(True, strip, caller, request_id)
        return self._verdict

    async def on_request_body(self, body: bytes) -> Routed:
        verdict = self._verdict
        if verdict is None or not verdict.inference or verdict.caller is None:
            raise InvalidRequest("Request body without an inference request.", reason="protocol")
        policy = self._decider.policy()
        if len(body) > policy.max_body_bytes:
            raise _too_large(len(body), policy)
        request = parse_inference_body(self._path, body)
        prompt_tokens, estimate = await self._decider.count_prompt(request, policy)
        max_tokens = request.max_tokens or policy.default_max_tokens
        if prompt_tokens + max_tokens > policy.max_context_tokens:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {policy.max_context_tokens} tokens. "
                f"However, you requested {prompt_tokens + max_tokens} tokens "
                f"({prompt_tokens} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                reason="context_length_exceeded",
            )
        context = prompt_tokens + max_tokens
        decision = RoutingDecision(
            request_id=verdict.request_id,
            caller=verdict.caller,
            pool=policy.pool_for(context),
            bucket=policy.bucket_for(context),
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            estimate=estimate,
            stream=request.stream,
        )
        inflight = self._decider.inflight
        tracking_id = inflight.new_id()
        admitted = await self._decider.admission.admit(decision, tracking_id)
        inflight.put(tracking_id, admitted.decision)
        new_body = with_usage_requested(body, request)
        if admitted.decision.model_override is not None:
            new_body = with_model(new_body or body, admitted.decision.model_override)
        return Routed(admitted.decision, tracking_id, new_body, admitted.response_headers)


def _too_large(size_bytes: int, policy: Policy) -> BodyTooLarge:
    return BodyTooLarge(
        f"Request body is {size_bytes} bytes; the limit is {policy.max_body_bytes} bytes.",
        reason="body_too_large",
    )
