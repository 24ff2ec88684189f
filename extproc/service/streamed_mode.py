"""The endpoint picker protocol's streaming mode: one ext_proc stream's side of it.

A gateway's Envoy streams bodies FULL_DUPLEX_STREAMED (`protocol_config` on the stream's
first message): the request body is gathered until its end, the headers' reply waits for the
body's decision, bodies go back as `streamed_response` chunks, and the request ends with its
stream (no access log comes). That protocol is its own concept, apart from the two- and
one-message modes of slogate's own configurations, so it lives here: `StreamedExchange` holds
one stream's state and answers its messages; the servicer (extproc.service.ext_proc) opens
one per stream (`streamed_exchange`) and lends it its decision steps (`StreamedServicer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import InternalError, RequestRejected
from admission.waiting_room import WaitNotice
from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.first_output import FirstOutput
from extproc.request.flow import RequestFlow
from extproc.request.response_usage import ResponseUsage
from extproc.request.verdicts import HeaderVerdict, Routed
from extproc.service.access_log import finish
from extproc.service.metrics import SidecarMetrics
from extproc.service.outcomes import outcome_from_stream
from extproc.service.replies import (
    deferred_header_reply,
    header_reply,
    headers_to_dict,
    passthrough_reply,
    served_endpoint,
    streamed_body,
    subset_hint,
)

log = logging.getLogger("slogate.extproc")

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


class RequestEnds(Protocol):
    """Where a request whose end its own stream saw is recorded (the access log's
    recorder, extproc.service.access_log.OutcomeRecorder.ended): settled once."""

    def ended(
        self, tracking: str, build: Callable[[RoutingDecision], RequestOutcome]
    ) -> list[Awaitable[None]]: ...

    def maybe_undelivered(
        self, tracking: str, request_id: str, build: Callable[[RoutingDecision], RequestOutcome]
    ) -> list[Awaitable[None]]: ...


class StreamedServicer(Protocol):
    """What the streaming mode uses of the servicer (extproc.service.ext_proc): its
    metrics, where ends are recorded, and its decision steps, shared with the other modes."""

    _metrics: SidecarMetrics
    _ends: RequestEnds | None
    _ending: set[asyncio.Task[None]]

    async def _answer(
        self,
        flow: RequestFlow,
        phase: str,
        request: pb.ProcessingRequest,
        on_wait: WaitNotice | None = None,
        body: bytes = b"",
    ) -> pb.ProcessingResponse: ...

    def _body_replies(
        self, flow: RequestFlow, request: pb.ProcessingRequest, started: float, body: bytes
    ) -> AsyncIterator[pb.ProcessingResponse]: ...

    def _rejection(self, error: RequestRejected, flow: RequestFlow) -> pb.ProcessingResponse: ...

    async def _on_headers(
        self,
        flow: RequestFlow,
        fields: dict[str, str],
        end_of_stream: bool,
        request: pb.ProcessingRequest,
    ) -> HeaderVerdict: ...

    def _routed(self, flow: RequestFlow, routed: Routed, reply: pb.ProcessingResponse) -> None: ...


@dataclass(slots=True)
class StreamedExchange:
    """One stream in the endpoint picker protocol's streaming mode: the request body
    gathered until its end, the headers' reply held until then, what was seen of the
    response (status, the endpoint that served, its usage, when its first byte and its
    first output event came)."""

    servicer: StreamedServicer
    response_streamed: bool  # response bodies go back as streamed_response too
    body: list[bytes] = field(default_factory=list)
    held_headers: bool = False  # the request headers are waiting for the body's decision
    passthrough: bool = False  # not a request slogate decides on its body: echoed
    decided: bool = False
    status: int = 0
    served: str = ""
    usage: ResponseUsage = field(default_factory=ResponseUsage)
    first_byte_s: float | None = None
    first_output: FirstOutput = field(default_factory=FirstOutput)
    first_output_s: float | None = None  # a stream's first output event (first_output)
    ended: bool = False

    def closed(self, flow: RequestFlow, _: object) -> None:
        self.end_soon(flow, "ext_proc_stream_closed")

    def end_soon(self, flow: RequestFlow, details: str) -> None:
        """End the request (`_end`) in a task of its own: nothing waits for it, and it runs
        whatever becomes of the stream's generator."""
        if self.ended:
            return
        ending = self.servicer._ending
        task = asyncio.get_running_loop().create_task(self._end(flow, details))
        ending.add(task)
        task.add_done_callback(ending.discard)

    async def replies(
        self,
        flow: RequestFlow,
        phase: str,
        request: pb.ProcessingRequest,
        started: float,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Streaming mode: one message's replies (none while the request body gathers)."""
        servicer = self.servicer
        if phase == "request_headers":
            flow.subset_hint = subset_hint(request)
            headers = request.request_headers
            if headers.end_of_stream:
                self.passthrough = True  # no body: decided on the headers, as ever
                yield await servicer._answer(flow, phase, request)
                return
            try:
                verdict = await servicer._on_headers(flow, headers_to_dict(headers), False, request)
            except RequestRejected as error:
                self.ended = True
                yield servicer._rejection(error, flow)
                return
            except Exception:
                log.exception("ext_proc %s failed", phase)
                self.ended = True
                failed = InternalError(
                    "The gateway failed to process the request.", reason="internal"
                )
                yield servicer._rejection(failed, flow)
                return
            servicer._metrics.decision_seconds(phase).observe(time.perf_counter() - started)
            if verdict.inference:
                self.held_headers = True  # answered once the body has ended
                return
            self.passthrough = True
            reply = header_reply(verdict)
            if verdict.routed is not None:
                servicer._routed(flow, verdict.routed, reply)
            yield reply
        elif phase == "request_body":
            chunk = request.request_body
            if self.passthrough or self.decided:
                for reply in streamed_body(phase, chunk.body, chunk.end_of_stream):
                    yield reply
                return
            self.body.append(chunk.body)
            if chunk.end_of_stream:
                async for reply in self._decide(flow, request, started, True):
                    yield reply
        elif phase == "request_trailers":
            if self.held_headers and not self.decided:
                async for reply in self._decide(flow, request, started, False):
                    yield reply
            if not self.ended:
                yield passthrough_reply(request)
        elif phase == "response_headers":
            self.served = served_endpoint(request)
            if self.served:
                flow.on_served(self.served)
            status = headers_to_dict(request.response_headers).get(":status", "0")
            # isascii: "²" is a digit to isdigit() and not to int().
            self.status = int(status) if status.isascii() and status.isdigit() else 0
            if request.response_headers.end_of_stream:
                self.end_soon(flow, "via_upstream")
            yield passthrough_reply(request)
        elif phase == "response_body":
            chunk = request.response_body
            if self.first_byte_s is None:
                self.first_byte_s = time.time()
            if self.first_output.feed(chunk.body):
                self.first_output_s = time.time()
            self.usage.feed(chunk.body)
            if chunk.end_of_stream:  # before the last reply: Envoy may close the stream
                self.end_soon(flow, "via_upstream")
            if self.response_streamed:
                for reply in streamed_body(phase, chunk.body, chunk.end_of_stream):
                    yield reply
            else:
                yield passthrough_reply(request)
        else:  # response trailers
            self.end_soon(flow, "via_upstream")
            yield passthrough_reply(request)

    async def _decide(
        self,
        flow: RequestFlow,
        request: pb.ProcessingRequest,
        started: float,
        end_of_stream: bool,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """The gathered body decided: the held headers answered with the decision, then the
        (maybe rewritten) body; or the client's error."""
        self.decided = True
        body = b"".join(self.body)
        self.body.clear()
        async for reply in self.servicer._body_replies(flow, request, started, body):
            if reply.HasField("immediate_response"):
                self.ended = True
                yield reply
            elif reply.HasField("request_body"):
                mutation = reply.request_body.response.body_mutation
                forwarded = mutation.body if mutation.HasField("body") else body
                chunks = streamed_body("request_body", forwarded, end_of_stream)
                if self.held_headers:
                    yield deferred_header_reply(reply)
                elif reply.HasField("dynamic_metadata"):
                    # No header message came to answer (Envoy skipped the headers): a
                    # headers reply would be one for a phase never sent. The decision's
                    # metadata (its id, the pool) goes with the body instead.
                    chunks[0].dynamic_metadata.CopyFrom(reply.dynamic_metadata)
                for chunk in chunks:
                    yield chunk
            else:  # the waiting room's timeout override
                yield reply

    async def _end(self, flow: RequestFlow, details: str) -> None:
        """A routed request's end as its stream saw it: recorded (settled) once."""
        if self.ended:
            return
        self.ended = True
        routed = flow.routed
        ends = self.servicer._ends
        if routed is None or ends is None:
            return
        now_s = time.time()
        # A stream's first token is its first output event (a Responses stream's first
        # bytes come before any token); a JSON answer's is its first byte.
        first_s = self.first_output_s if self.first_output_s is not None else self.first_byte_s
        ttft_s = None if first_s is None else first_s - flow.arrived_s
        status = self.status

        def outcome(decision: RoutingDecision) -> RequestOutcome:
            return outcome_from_stream(
                decision,
                routed.tracking_id,
                status,
                self.usage,
                ttft_s,
                now_s - flow.arrived_s,
                self.served,
                details if status == 0 else "via_upstream",
            )

        await finish(ends.ended(routed.tracking_id, outcome))


def streamed_exchange(
    config: pb.ProtocolConfiguration, servicer: StreamedServicer
) -> StreamedExchange | None:
    """Streaming mode when Envoy streams the request body full duplex (the endpoint picker
    protocol's); None: the two- or one-message mode of slogate's own configurations."""
    if config.request_body_mode != _FULL_DUPLEX:
        return None
    return StreamedExchange(servicer, response_streamed=config.response_body_mode == _FULL_DUPLEX)
