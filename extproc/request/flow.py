"""What slogate decides for one request, phase by phase, without any gRPC.

What lives here: `Decider` (shared, one per sidecar) and `RequestFlow` (one per Envoy
stream). The flow turns request headers into a `HeaderVerdict` and the buffered body into a
`Routed` decision, or raises a `RequestRejected`. Protobuf building and metrics live
elsewhere (extproc.service), so this can be unit-tested with plain dicts.

The `Decider`'s two halves are the one path from a parsed request to an admitted
decision: count the prompt, pick bucket and pool and check the model maximum
(`count_and_route`, with extproc.request.routing), then run the admission chain and wait
for the request's end in the in-flight table (`admit_counted`). The sidecar's body phase
keeps the request's shape between them (the traffic record's, for a refusal too); the
simulator runs the same two with requests built from its arrivals (sim.fleet.sidecar), so
both decide alike. A flow takes one policy snapshot when its stream opens and passes it to every
step of its request: nothing below re-reads the policy.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from admission.access import AccessStep
from admission.chain import AdmissionChain
from admission.decision import Admitted, Applicant, RoutingDecision
from admission.errors import (
    BodyTooLarge,
    InvalidRequest,
    MethodNotAllowed,
    NoEndpoint,
    NotFound,
)
from admission.kv.capacity import kv_footprint
from admission.waiting_room import WaitNotice
from engines.picker import EnginePicker
from engines.prefix import NO_BLOCKS, PromptBlocks, prompt_blocks
from extproc.request.bodies.parse import parse_inference_body
from extproc.request.bodies.request import InferenceRequest
from extproc.request.bodies.rewrite import adds_usage, rewritten_body
from extproc.request.contract import DESTINATION_HEADER, SLOGATE_HEADER_PREFIX
from extproc.request.crossing_token import HOME, Arrival, CrossingDesk
from extproc.request.identity import IdentityResolver
from extproc.request.inflight import InFlight
from extproc.request.routing import engine_priority, request_decision, route
from extproc.request.tokens.corrections import PromptCorrections
from extproc.request.tokens.prompt import PromptCount, PromptCounter
from extproc.request.tokens.templated import TemplatedIds
from extproc.request.verdicts import (
    Admitter,
    CandidatePolicy,
    CountedRequest,
    HeaderVerdict,
    Routed,
)
from policy.apis import Api, ErrorStyle, PathClass, error_style_for
from policy.domain import ApiKey, Pool
from policy.schema import Policy


class Decider:
    """Everything a decision needs that outlives one request."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        identity: IdentityResolver,
        counter: PromptCounter,
        admission: Admitter | None = None,
        inflight: InFlight[RoutingDecision] | None = None,
        corrections: PromptCorrections | None = None,
        picker: EnginePicker | None = None,
        candidate: CandidatePolicy | None = None,
        crossing: CrossingDesk | None = None,
    ) -> None:
        """`picker`: names the engine of each admitted request in pools where slogate
        picks (None: Envoy balances everywhere); `candidate`: a policy judged beside;
        `crossing`: mints and verifies the crossing tokens of requests sent between
        regions (None: no secret, nothing crosses and no token is trusted)."""
        self.crossing = crossing
        self.policy = policy
        self.candidate = candidate
        self.picker = picker
        self.identity = identity
        self.counter = counter
        self.templated = TemplatedIds(counter)
        self.corrections = corrections or PromptCorrections()
        # Without a chain of its own: the access check alone (a chain's first step, always).
        self.admission: Admitter = admission or AdmissionChain([AccessStep()])
        # Decisions wait here for their access-log entry; expired after the upstream timeout.
        # (`is None`, not `or`: an empty InFlight is falsy, and the one given was dropped.)
        self.inflight: InFlight[RoutingDecision] = (
            inflight
            if inflight is not None
            else InFlight(time.monotonic, policy().upstream_timeout_s + 60.0)
        )

    def new_flow(self) -> RequestFlow:
        return RequestFlow(self)

    async def count_prompt(
        self, request: InferenceRequest, caller: ApiKey, policy: Policy
    ) -> tuple[PromptCount, float]:
        """Prompt tokens (see extproc.request.tokens.prompt for the rule and its bound),
        times the caller's correction when its settled prompts keep exceeding its counts;
        and that correction. `policy`: the request's snapshot, the one its blocks are
        hashed under again below (never re-read: a reload between the header and body
        phases would count in blocks of one size and hash in blocks of another)."""
        picking = self.picker is not None and self.picker.wants_blocks(policy)
        block_tokens = policy.engines.picking.block_tokens if picking else 0
        counted = await self.counter.count(
            request.prompt_texts, request.prompt_token_ids, block_tokens
        )
        factor = self.corrections.factor(caller.key_id)
        if factor == 1.0 or not counted.exact:
            return counted, 1.0
        corrected = math.ceil(counted.tokens * factor)
        return dataclasses.replace(counted, tokens=corrected), factor

    async def count_and_route(
        self,
        request: InferenceRequest,
        caller: ApiKey,
        request_id: str,
        api: Api,
        policy: Policy,
        body: bytes | None = None,
    ) -> CountedRequest:
        """A parsed request counted and routed, not yet admitted: its decision is the
        request's shape, which the traffic record keeps for a refused request too."""
        if request.sequences > policy.max_sequences:
            raise InvalidRequest(
                f"This request asks for {request.sequences} completions at once (n, best_of "
                f"or a batch of prompts); this gateway allows at most {policy.max_sequences}.",
                reason="too_many_sequences",
            )
        counted, correction = await self.count_prompt(request, caller, policy)
        body_bytes = 0 if body is None else len(body)
        decision = route(policy, request, caller, request_id, api, counted, correction, body_bytes)
        if self.candidate is not None:
            decision = self.candidate.attach(decision)
        blocks = NO_BLOCKS
        if counted.blocks is not None and counted.lengths is not None:
            blocks = prompt_blocks(
                counted.blocks,
                counted.lengths,
                policy.engines.picking.block_tokens,
                request.conversation_texts,
            )
            blocks = await self._engine_ids(request, policy, decision.pool, blocks)
        return CountedRequest(request, counted, decision, blocks, body)

    async def _engine_ids(
        self, request: InferenceRequest, policy: Policy, pool: str, blocks: PromptBlocks
    ) -> PromptBlocks:
        """The ids the engines will see, where the request's pool follows their KV events
        and slogate picks among several of them (engines.cached_blocks scores with them)."""
        spec = policy.pools.get(pool)
        if (
            spec is None
            or spec.kv_events is None
            or not request.chat_roles
            or self.picker is None
            or self.picker.fleet.count(pool) < 2
            or not self.picker.picks(spec)
        ):
            return blocks
        ids = await self.templated.ids(request.chat_roles, request.prompt_texts, spec.kv_events)
        return blocks if ids is None else dataclasses.replace(blocks, engine_ids=ids)

    async def admit_counted(
        self,
        counted: CountedRequest,
        policy: Policy,
        on_wait: WaitNotice | None = None,
        within: Collection[str] | None = None,
    ) -> Routed:
        """A counted request admitted (`body` rewritten when needed), or refused; judged
        beside under the candidate policy when one is loaded. `within`: the endpoints a
        gateway allows (the endpoint picker protocol's subset hint), None: any."""
        decision = counted.decision
        admitted = self.admit(
            decision, policy, counted.request, counted.body, counted.blocks, on_wait, within
        )
        if self.candidate is not None and decision.candidate is not None:
            return await self.candidate.beside(admitted, counted, policy)
        return await admitted

    async def admit(
        self,
        decision: RoutingDecision,
        policy: Policy,
        request: InferenceRequest | None = None,
        body: bytes | None = None,
        blocks: PromptBlocks = NO_BLOCKS,
        on_wait: WaitNotice | None = None,
        within: Collection[str] | None = None,
    ) -> Routed:
        inflight = self.inflight
        tracking_id = inflight.new_id()
        picking = self.picker is not None and decision.meters_tokens
        if picking and within is not None:
            # Refused before anything is held or waited for when the hint rules out every
            # engine of the pool it is routed to.
            self._hinted(policy.pools.get(decision.pool), within)
        admitted = await self.admission.admit(Applicant(decision, tracking_id, policy, on_wait))
        if picking:
            try:
                admitted = self._pick(admitted, tracking_id, policy, blocks, within)
            except NoEndpoint:
                # Admitted, then nothing the hint allows was left (the breaker moved it to
                # another pool, or the engines died while it waited): it holds nothing.
                await self.admission.release(admitted.decision, tracking_id)
                raise
        inflight.put(tracking_id, admitted.decision)
        upstream: dict[str, str] = {}
        if self.crossing is not None:
            upstream = self.crossing.departure(
                admitted.decision, decision.request_id, policy.regions
            )
        new_body = None
        if request is not None and body is not None:
            decided = admitted.decision
            written = decided.max_tokens if request.max_tokens is None else None
            spec = policy.pools.get(decided.pool)
            priority = (
                engine_priority(decided.caller.tier)
                if spec is not None and spec.priority_scheduling
                else None
            )
            new_body = rewritten_body(body, request, written, decided.model_override, priority)
        hide_usage = request is not None and adds_usage(request)
        headers = admitted.response_headers
        proof = inflight.proof(tracking_id)
        return Routed(
            admitted.decision, tracking_id, new_body, headers, hide_usage, proof, upstream
        )

    def _hinted(self, spec: Pool | None, within: Collection[str]) -> None:
        """Raise NoEndpoint when slogate picks in the pool and no serving engine of it is
        among the endpoints the gateway allows (where slogate does not pick, the hint is
        the picker's business: nothing changes)."""
        assert self.picker is not None
        if spec is None or not self.picker.picks(spec) or self.picker.eligible(spec, within):
            return
        allowed = ", ".join(sorted(within)) or "none"
        raise NoEndpoint(
            f"None of the endpoints the gateway allows for this request ({allowed}) can "
            f"serve it in pool {spec.name!r}.",
            reason="no_hinted_endpoint",
            retry_after_s=1,
        )

    def _pick(
        self,
        admitted: Admitted,
        tracking_id: str,
        policy: Policy,
        blocks: PromptBlocks,
        within: Collection[str] | None = None,
    ) -> Admitted:
        """The engine of an admitted request, in the pool it was admitted to (the breaker
        may have moved it to the fallback pool), among `within` when given."""
        assert self.picker is not None
        decided = admitted.decision
        spec = policy.pools.get(decided.pool)
        if spec is None:
            return admitted
        engines = self.picker.pick(
            tracking_id,
            spec,
            blocks,
            decided.bucket.name,
            kv_footprint(decided.reserved_tokens, decided.bucket),
            decided.sequences,
            within,
        )
        if not engines:
            if within is not None:
                self._hinted(spec, within)
            return admitted
        return Admitted(decided.with_engines(engines), admitted.response_headers)


class RequestFlow:
    """One Envoy stream: headers first, then (for APIs whose body is read) the buffered body.

    The header phase classifies the path under the policy: public (forwarded as it is),
    an enabled API (identity required), or unknown (404: default deny). APIs whose body is
    not read (tokenize, the model list) are admitted right there, as one request each.
    """

    def __init__(self, decider: Decider) -> None:
        self._decider = decider
        self._policy = decider.policy()  # one snapshot for the whole request
        self._api: Api | None = None
        self._verdict: HeaderVerdict | None = None
        self.error_style = ErrorStyle.OPENAI
        # For the traffic record: when the stream began (wall clock), and the request's
        # shape once it was counted (a refusal's too).
        self.arrived_s = time.time()
        self.shape: RoutingDecision | None = None
        # The client's trace context, when the servicer traces (extproc.service.tracing).
        self.trace_parent: Any = None
        # The endpoints the gateway allows (the endpoint picker protocol's subset hint, from
        # the metadata Envoy forwards); None: no hint, any engine of the pool.
        self.subset_hint: frozenset[str] | None = None
        self.routed: Routed | None = None  # once admitted
        # Where the request comes from: another region's (a crossing token), or this one's.
        self.arrival = HOME

    @property
    def request_id(self) -> str:
        return self._verdict.request_id if self._verdict is not None else ""

    @property
    def headers_seen(self) -> bool:
        """Whether the header phase ran (with one message per request it runs in the body's
        message, on the headers forwarded as metadata)."""
        return self._verdict is not None

    @property
    def caller(self) -> ApiKey | None:
        return self._verdict.caller if self._verdict is not None else None

    async def on_request_headers(
        self,
        headers: Mapping[str, str],
        end_of_stream: bool,
        claims: Mapping[str, Any] | None = None,
    ) -> HeaderVerdict:
        policy = self._policy
        path = headers.get(":path", "")
        self.error_style = error_style_for(path)
        # A client's copy of what only the sidecar sets: its x-slogate-* headers, and the
        # endpoint picker protocol's destination (a cluster reading the header would send
        # the request where the client said, where slogate names no engine).
        strip = tuple(
            h for h in headers if h.startswith(SLOGATE_HEADER_PREFIX) or h == DESTINATION_HEADER
        )
        request_id = headers.get("x-request-id", "")
        if self._decider.crossing is not None:  # read before its header is removed
            self.arrival = self._decider.crossing.arrival(headers, policy.regions)
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
        caller = self._decider.identity.resolve(headers, claims, policy)
        method = headers.get(":method", "POST")
        if method not in api.methods:
            allowed = ", ".join(sorted(api.methods))
            raise MethodNotAllowed(
                f"{method} is not supported on {api.path}; use {allowed}.",
                reason="method_not_allowed",
                headers={"allow": allowed},
            )
        if not api.reads_body:
            decision = self.shape = _arrived(
                request_decision(policy, api, caller, request_id), self.arrival
            )
            routed = await self._decider.admit(decision, policy)
            self._verdict = HeaderVerdict(False, strip, caller, request_id, routed)
            return self._verdict
        if end_of_stream:
            raise InvalidRequest("The request has no body.", reason="missing_body")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > policy.max_body_bytes:
            raise _too_large(int(declared), policy)
        self._verdict = HeaderVerdict(True, strip, caller, request_id)
        return self._verdict

    async def on_request_body(self, body: bytes, on_wait: WaitNotice | None = None) -> Routed:
        """The body's decision; `on_wait`: told how long the request may wait, when it
        enters the waiting room (the servicer lifts Envoy's message timeout by as much)."""
        verdict = self._verdict
        api = self._api
        if verdict is None or not verdict.inference or verdict.caller is None or api is None:
            raise InvalidRequest("Request body without an inference request.", reason="protocol")
        assert api.shape is not None
        policy = self._policy
        if len(body) > policy.max_body_bytes:
            raise _too_large(len(body), policy)
        request = parse_inference_body(api.shape, body)
        decider = self._decider
        counted = await decider.count_and_route(
            request, verdict.caller, verdict.request_id, api, policy, body
        )
        if self.arrival is not HOME:
            arrived = _arrived(counted.decision, self.arrival)
            counted = dataclasses.replace(counted, decision=arrived)
        self.shape = counted.decision
        self.routed = await decider.admit_counted(counted, policy, on_wait, self.subset_hint)
        return self.routed

    def on_served(self, address: str) -> None:
        """The engine that served the request, as the gateway reports it (the endpoint
        picker protocol's served endpoint): a fallback's answer moves the request's hold."""
        routed = self.routed
        picker = self._decider.picker
        if routed is not None and picker is not None and address and routed.decision.engines:
            picker.served(routed.tracking_id, address)


def _arrived(decision: RoutingDecision, arrival: Arrival) -> RoutingDecision:
    """The decision of a request that came from another region: charged there (verified),
    never sent on."""
    if arrival is HOME:
        return decision
    return dataclasses.replace(
        decision, crossed_from=arrival.crossed_from, may_cross=arrival.may_cross
    )


def _too_large(size_bytes: int, policy: Policy) -> BodyTooLarge:
    return BodyTooLarge(
        f"Request body is {size_bytes} bytes; the limit is {policy.max_body_bytes} bytes.",
        reason="body_too_large",
    )
