"""A span per decision in the request's own trace, exported over OTLP/gRPC.

What lives here: `DecisionTracer` (built from the policy's `telemetry.tracing`, once, at
start; a RequestObserver, extproc.service.observers) and `start_tracing`, which returns
None when the section is absent. With tracing off the tracer is not among the request's
observers: nothing here runs and OpenTelemetry is never imported — every OpenTelemetry
import in this module happens inside `DecisionTracer.__init__`.

The parent is the client's W3C `traceparent` / `tracestate`, which Envoy passes on in the
request headers message. The span starts when the ext_proc stream opened and ends when the
decision is known (routed, refused, shed, failed, or abandoned while waiting); a routed
request's upstream `traceparent` is overwritten with the span's id, so the engine's own
spans nest under the decision. A span carries slogate.* attributes only: never prompt text,
never an API key (the key id at most, as in the decision log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import InternalError, Overloaded, RequestRejected
from extproc.service.log_records import REQUEST_ID
from extproc.service.replies import set_headers

if TYPE_CHECKING:
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed
    from extproc.service.observers import RequestSeen
    from policy._telemetry import TracingConfig

log = logging.getLogger("slogate.tracing")

SPAN_NAME = "slogate.decision"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# How long a stopping sidecar waits for the last batch to reach the collector: an
# unreachable collector must not hold the pod's shutdown for the exporter's retries.
CLOSE_WAIT_S = 2.0


def outcome_of(error: RequestRejected) -> str:
    """A refusal as a span outcome: shed (the breaker or the waiting room said the fleet is
    full), failed (a slogate bug), refused (anything about the request or its caller)."""
    if isinstance(error, Overloaded):
        return "shed"
    if isinstance(error, InternalError):
        return "failed"
    return "refused"


def decision_attributes(decision: RoutingDecision) -> dict[str, Any]:
    """What a span says about a decision: who asked, where it went, what it was charged."""
    caller = decision.caller
    attributes: dict[str, Any] = {
        "slogate.request_id": decision.request_id,
        "slogate.tenant": caller.tenant,
        "slogate.tier": caller.tier.value,
        "slogate.key_id": caller.key_id,
        "slogate.api": decision.api.name,
        "slogate.pool": decision.pool,
        "slogate.bucket": decision.bucket.name,
        "slogate.prompt_tokens": decision.prompt_tokens,
        "slogate.prompt_estimate": decision.estimate.value,
        "slogate.max_tokens": decision.max_tokens,
        "slogate.breaker_level": decision.level.name,
    }
    if decision.waited_s > 0:
        attributes["slogate.waited_ms"] = round(decision.waited_s * 1000, 1)
    if decision.engines:
        attributes["slogate.engine"] = decision.engines[0]
    return attributes


class DecisionTracer:
    """OpenTelemetry's SDK: a tracer provider of its own (the process-global one is left
    alone), sampled by `sample_ratio` unless the client's trace is sampled already, and a
    BatchSpanProcessor whose thread sends batches to `otlp_endpoint` (its batch size and
    delay follow the SDK's OTEL_BSP_* environment variables)."""

    def __init__(self, config: TracingConfig) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        ratio = TraceIdRatioBased(config.sample_ratio)
        # A client that traces but did not sample this request is sampled at the ratio too:
        # the span still lands in its trace.
        sampler = ParentBased(root=ratio, remote_parent_not_sampled=ratio)
        self._provider = TracerProvider(
            sampler=sampler, resource=Resource.create({"service.name": config.service_name})
        )
        endpoint = config.otlp_endpoint
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https:"))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("slogate")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.INTERNAL
        self._failed = Status(StatusCode.ERROR)
        self.endpoint = endpoint

    def parent(self, headers: Mapping[str, str]) -> Any:
        """The client's trace context from the request headers; None starts a new trace."""
        if TRACEPARENT not in headers:
            return None
        return self._propagator.extract(headers)

    def arrived(self, flow: RequestSeen, headers: Mapping[str, str]) -> None:
        """The request's span will sit in the client's trace."""
        flow.trace_parent = self.parent(headers)

    def routed(self, flow: RequestSeen, routed: Routed, reply: pb.ProcessingResponse) -> None:
        """The span of an admitted request; its id goes upstream in `traceparent`."""
        attributes = decision_attributes(routed.decision)
        attributes["slogate.outcome"] = "routed"
        span = self._span(flow, attributes)
        context = span.get_span_context()
        if not context.trace_flags.sampled:
            return  # the client's own traceparent travels on unchanged
        phase = reply.WhichOneof("response")
        common = getattr(reply, str(phase)).response
        headers = {TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-01"}
        if context.trace_state:
            headers[TRACESTATE] = context.trace_state.to_header()
        set_headers(common.header_mutation, headers)

    def refused(self, flow: RequestSeen, error: RequestRejected) -> None:
        """The span of a refusal: what was known of the request when it was refused."""
        attributes = decision_attributes(flow.shape) if flow.shape is not None else {}
        caller = flow.caller
        if caller is not None and flow.shape is None:
            attributes["slogate.tenant"] = caller.tenant
            attributes["slogate.tier"] = caller.tier.value
            attributes["slogate.key_id"] = caller.key_id
        attributes["slogate.request_id"] = flow.request_id or REQUEST_ID.get() or ""
        attributes["slogate.outcome"] = outcome_of(error)
        attributes["slogate.reason"] = error.reason
        attributes["http.response.status_code"] = error.status
        self._span(flow, attributes, failed=isinstance(error, InternalError))

    def abandoned(self, flow: RequestSeen) -> None:
        """The stream went away while its decision waited (the client left)."""
        attributes = decision_attributes(flow.shape) if flow.shape is not None else {}
        attributes["slogate.request_id"] = flow.request_id or REQUEST_ID.get() or ""
        attributes["slogate.outcome"] = "abandoned"
        self._span(flow, attributes)

    def _span(self, flow: RequestSeen, attributes: dict[str, Any], failed: bool = False) -> Any:
        """One ended span from the stream's start until now."""
        span = self._tracer.start_span(
            SPAN_NAME,
            context=flow.trace_parent,
            kind=self._kind,
            attributes=attributes,
            start_time=int(flow.arrived_s * 1e9),
        )
        if failed:
            span.set_status(self._failed)
        span.end(end_time=time.time_ns())
        return span

    def record(self, outcome: RequestOutcome) -> None:
        """Its answer: nothing to add, the span ended with the decision."""

    def close(self) -> None:
        """Send what is batched, waiting at most CLOSE_WAIT_S for the collector."""
        done = threading.Thread(target=self._provider.shutdown, name="slogate-otlp", daemon=True)
        done.start()
        done.join(CLOSE_WAIT_S)
        if done.is_alive():
            log.warning("the OTLP collector %s took the last spans too long", self.endpoint)


class TracingUnavailable(Exception):
    """`telemetry.tracing` is set but OpenTelemetry is not installed."""


def start_tracing(config: TracingConfig | None) -> DecisionTracer | None:
    """The tracer of `telemetry.tracing`, or None (no section: no tracing, no import)."""
    if config is None:
        return None
    try:
        return DecisionTracer(config)
    except ImportError as missing:
        raise TracingUnavailable(
            f"the policy sets telemetry.tracing, but OpenTelemetry is not installed "
            f"({missing.name}): pip install 'slogate[tracing]'"
        ) from missing
