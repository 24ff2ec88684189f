"""ext_proc replies: the only place that turns decisions and errors into protobuf.

What lives here: builders for the header reply, the routed body reply, the pass-through
reply, and `rejection`, the one function that maps a `RequestRejected` to Envoy's
ImmediateResponse (status, OpenAI JSON error body, Retry-After).

Envoy 1.40 reads and writes header values as `raw_value` bytes; `value` must stay empty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from google.protobuf import json_format

from admission.decision import RoutingDecision
from admission.errors import RequestRejected, error_document
from extproc.envoypb.envoy.config.core.v3 import base_pb2
from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.type.v3 import http_status_pb2
from extproc.request.contract import (
    BUCKET_HEADER,
    DESTINATION_HEADER,
    DESTINATION_KEY,
    DESTINATION_NAMESPACE,
    ESTIMATE_HEADER,
    FAIRNESS_HEADER,
    JWT_AUTHN_NAMESPACE,
    JWT_PAYLOAD_KEY,
    LLM_D_FAIRNESS_HEADER,
    LLM_D_OBJECTIVE_HEADER,
    METADATA_NAMESPACE,
    OBJECTIVE_HEADER,
    POOL_FIELD,
    POOL_HEADER,
    REASON_HEADER,
    SERVED_KEY,
    SETTLE_PROMPTLY_FIELD,
    STRIP_USAGE_FIELD,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
    TENANT_HEADER,
    TIER_HEADER,
    TRACKING_ID_FIELD,
    USAGE_PROOF_FIELD,
)
from extproc.request.verdicts import HeaderVerdict, Routed
from policy.apis import ErrorStyle

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def set_headers(mutation: pb.HeaderMutation, headers: Mapping[str, str]) -> None:
    # add() + field assignment builds in place: 2-3x cheaper than constructing messages.
    options = mutation.set_headers
    for key, value in headers.items():
        option = options.add(append_action=_OVERWRITE)
        option.header.key = key
        option.header.raw_value = value.encode()


def headers_to_dict(header_map: pb.HttpHeaders) -> dict[str, str]:
    return {
        h.key: (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in header_map.headers.headers
    }


def jwt_claims(request: pb.ProcessingRequest) -> dict[str, Any] | None:
    """The payload jwt_authn verified (forwarded as metadata), or None without a token."""
    namespaces = request.metadata_context.filter_metadata
    authn = namespaces.get(JWT_AUTHN_NAMESPACE) if namespaces else None
    if authn is None:
        return None
    payload = authn.fields.get(JWT_PAYLOAD_KEY)
    if payload is None:
        return None
    return json_format.MessageToDict(payload.struct_value)


def header_reply(verdict: HeaderVerdict) -> pb.ProcessingResponse:
    reply = pb.ProcessingResponse()
    reply.request_headers.SetInParent()  # an empty CONTINUE is still a headers reply
    common = reply.request_headers.response
    if verdict.strip_headers:
        common.header_mutation.remove_headers.extend(verdict.strip_headers)
        # The route may have been chosen on a spoofed header: pick it again without it.
        common.clear_route_cache = True
    if verdict.routed is not None:
        # Admitted with its headers (an API whose body is not read): route it now.
        _route(reply, common, verdict.routed)
    if not verdict.inference:
        reply.mode_override.CopyFrom(
            processing_mode_pb2.ProcessingMode(
                request_body_mode=processing_mode_pb2.ProcessingMode.NONE,
                response_header_mode=processing_mode_pb2.ProcessingMode.SKIP,
            )
        )
    return reply


def routed_body_reply(routed: Routed, headers_in_metadata: bool = False) -> pb.ProcessingResponse:
    """`headers_in_metadata`: one ext_proc message per request (extproc.service.one_message),
    where Envoy drops header mutations: the upstream headers go straight into the metadata
    the pool routes render, instead of a mutation moved there afterwards (building and
    reading back the mutation cost about as much as the rest of the reply)."""
    reply = pb.ProcessingResponse()
    common = reply.request_body.response
    if routed.new_body is not None:
        common.body_mutation.body = routed.new_body
    _route(reply, common, routed, headers_in_metadata)
    return reply


def upstream_headers(decision: RoutingDecision) -> dict[str, str]:
    """What the pool is told about the request (client copies were removed)."""
    tier = decision.caller.tier.value
    return {
        POOL_HEADER: decision.pool,
        TENANT_HEADER: decision.caller.tenant,
        TIER_HEADER: tier,
        BUCKET_HEADER: decision.bucket.name,
        ESTIMATE_HEADER: str(decision.context_tokens),
        # For an endpoint picker behind slogate (the inference extension's protocol), under
        # both its names and llm-d's: the tenant's objective, else the tier's.
        OBJECTIVE_HEADER: decision.caller.objective,
        FAIRNESS_HEADER: decision.caller.tenant,
        LLM_D_OBJECTIVE_HEADER: decision.caller.objective,
        LLM_D_FAIRNESS_HEADER: decision.caller.tenant,
    }


def destination_endpoints(decision: RoutingDecision) -> str:
    """The engines slogate picked as the endpoint picker protocol spells them: "ip:port",
    best first, ordered fallbacks after commas; "" where slogate did not pick."""
    return ",".join(decision.engines)


def _route(
    reply: pb.ProcessingResponse,
    common: pb.CommonResponse,
    routed: Routed,
    headers_in_metadata: bool = False,
) -> None:
    """Upstream headers (`headers_in_metadata`: as METADATA_NAMESPACE fields named after
    them, see routed_body_reply), the pool in metadata (the route matches on it) and a
    fresh route."""
    headers = upstream_headers(routed.decision)
    # After the header reply removed any client copy (x-slogate-*): the sidecar's own.
    headers.update(routed.upstream_headers)
    if routed.new_body is not None:
        headers["content-length"] = str(len(routed.new_body))
    destination = destination_endpoints(routed.decision)
    if destination:
        # The endpoint picker protocol: one value, in the header and in `envoy.lb`.
        headers[DESTINATION_HEADER] = destination
        lb = reply.dynamic_metadata.fields[DESTINATION_NAMESPACE].struct_value.fields
        lb[DESTINATION_KEY].string_value = destination
    common.clear_route_cache = True
    fields = reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
    if headers_in_metadata:
        for name, value in headers.items():
            fields[name].string_value = value
    else:
        set_headers(common.header_mutation, headers)
    # The decision itself stays in the sidecar (extproc.request.inflight); only its id travels.
    fields[TRACKING_ID_FIELD].string_value = routed.tracking_id
    # ... with its proof, which Envoy copies into the access-log entry and renders nowhere.
    fields[USAGE_PROOF_FIELD].string_value = routed.usage_proof
    fields[POOL_FIELD].string_value = routed.decision.pool
    if routed.hide_usage:
        fields[STRIP_USAGE_FIELD].bool_value = True
    if routed.decision.settle_promptly:
        fields[SETTLE_PROMPTLY_FIELD].bool_value = True
    for name, value in routed.response_headers.items():
        fields[name].string_value = value  # see envoy_config.route_config


# How much longer Envoy waits for a waiting request's reply than the waiting room may hold
# the request and a decision may take after it. The room's deadline counts from the
# request's entry and Envoy's overridden timer from the override's arrival (later), yet
# the room's 503 still needs the sidecar to run after the deadline: its tick (ROOM_TICK_S),
# the event loop, the reply's way out through grpc. On a loaded machine the whole sidecar
# can get no CPU for seconds: on 2 cores, while a vLLM CPU engine prefilled two 2.5k-token
# prompts, its runnable threads waited 1.5-1.8 s at a time in the run queue and its loop
# stalled 2-5 s, and with no margin beyond the message timeout Envoy's timer fired first:
# the client got Envoy's 504 instead of slogate's 503 queue_timeout (tests/e2e/test_vllm).
# Twice the longest stall seen; only a sidecar that hangs with requests in its room is
# noticed this much later.
WAIT_REPLY_MARGIN_MS = 10_000


def wait_reply_ms(max_wait_s: float, message_timeout_ms: int) -> int:
    """How long Envoy waits for the reply to a request that may wait `max_wait_s`: its
    wait, a decision's message timeout after it, and the margin. The one rule for the
    override and for the filter's max_message_timeout (the policy's longest wait): Envoy
    ignores an override above max_message_timeout rather than capping it, so the value is
    rounded up from the wait alone and never exceeds what the longest wait gives."""
    return math.ceil(max_wait_s * 1000) + message_timeout_ms + WAIT_REPLY_MARGIN_MS


def timeout_override(milliseconds: int) -> pb.ProcessingResponse:
    """Tell Envoy to wait up to `milliseconds` for the reply it waits for, from the moment
    this arrives (honoured only up to the filter's max_message_timeout)."""
    reply = pb.ProcessingResponse()
    reply.override_message_timeout.FromMilliseconds(milliseconds)
    return reply


def passthrough_reply(request: pb.ProcessingRequest) -> pb.ProcessingResponse:
    """An empty CONTINUE for whatever phase Envoy sent (e.g. a local reply's headers)."""
    phase = request.WhichOneof("request")
    if phase in ("request_headers", "response_headers"):
        return pb.ProcessingResponse(**{phase: pb.HeadersResponse()})
    if phase in ("request_body", "response_body"):
        return pb.ProcessingResponse(**{phase: pb.BodyResponse()})
    return pb.ProcessingResponse(**{str(phase): pb.TrailersResponse()})


def error_body(error: RequestRejected, style: ErrorStyle = ErrorStyle.OPENAI) -> bytes:
    return msgspec.json.encode(
        error_document(style, error.status, error.message, error.error_type, error.code)
    )


def rejection(
    error: RequestRejected,
    style: ErrorStyle = ErrorStyle.OPENAI,
    extra_headers: Iterable[tuple[str, str]] = (),
) -> pb.ProcessingResponse:
    headers = {"content-type": "application/json", REASON_HEADER: error.reason}
    if error.retry_after_s is not None:
        headers["retry-after"] = str(max(1, int(error.retry_after_s)))
    headers.update(error.headers)
    headers.update(extra_headers)
    immediate = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=error.status),
        body=error_body(error, style),
        details=f"slogate_{error.reason}",
    )
    set_headers(immediate.headers, headers)
    return pb.ProcessingResponse(immediate_response=immediate)


# -- the endpoint picker protocol's streaming mode (FULL_DUPLEX_STREAMED bodies) -----------

# What one streamed body reply carries at most (the inference extension's picker uses the
# same bound: well under gRPC's default 4 MiB message, and Envoy's buffers).
STREAMED_CHUNK_BYTES = 62_000


def _namespace(request: pb.ProcessingRequest, name: str) -> Any:
    namespaces = request.metadata_context.filter_metadata
    return namespaces.get(name) if namespaces else None


def subset_hint(request: pb.ProcessingRequest) -> frozenset[str] | None:
    """The endpoints the gateway allows (`envoy.lb.subset_hint`), or None without a hint.
    A list of "ip:port", or one string of them separated by commas (both seen in
    gateways); an empty list allows none."""
    hint = _namespace(request, SUBSET_HINT_NAMESPACE)
    if hint is None or SUBSET_HINT_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_HINT_KEY]
    kind = value.WhichOneof("kind")
    items = (
        [v.string_value for v in value.list_value.values]
        if kind == "list_value"
        else [value.string_value]
        if kind == "string_value"
        else []
    )
    return frozenset(e.strip() for item in items for e in item.split(",") if e.strip())


def served_endpoint(request: pb.ProcessingRequest) -> str:
    """The endpoint that served (`envoy.lb` / x-gateway-destination-endpoint-served); ""
    when the gateway did not say."""
    lb = _namespace(request, DESTINATION_NAMESPACE)
    value = lb.fields.get(SERVED_KEY) if lb is not None else None
    return value.string_value if value is not None else ""


def streamed_body(phase: str, body: bytes, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    """`body` handed back in streamed_response chunks for `phase` (request_body or
    response_body); the last carries `end_of_stream`."""
    chunks = [
        body[start : start + STREAMED_CHUNK_BYTES]
        for start in range(0, len(body), STREAMED_CHUNK_BYTES)
    ] or [b""]
    replies = []
    for index, chunk in enumerate(chunks):
        reply = pb.ProcessingResponse()
        streamed = getattr(reply, phase).response.body_mutation.streamed_response
        streamed.body = chunk
        streamed.end_of_stream = end_of_stream and index == len(chunks) - 1
        replies.append(reply)
    return replies


def deferred_header_reply(body_reply: pb.ProcessingResponse) -> pb.ProcessingResponse:
    """A routed body reply's decision as the reply to the request headers, which streaming
    mode holds until the body ended (ENVOY-NOTES: the FULL_DUPLEX_STREAMED pattern): the
    header mutation, the fresh route and the metadata. Its body goes back apart
    (`streamed_body`); content-length is not set: that mode sends the body chunked."""
    reply = pb.ProcessingResponse()
    reply.request_headers.response.CopyFrom(body_reply.request_body.response)
    common = reply.request_headers.response
    common.ClearField("body_mutation")
    kept = [o for o in common.header_mutation.set_headers if o.header.key != "content-length"]
    del common.header_mutation.set_headers[:]
    common.header_mutation.set_headers.extend(kept)
    if body_reply.HasField("dynamic_metadata"):
        reply.dynamic_metadata.CopyFrom(body_reply.dynamic_metadata)
    return reply
