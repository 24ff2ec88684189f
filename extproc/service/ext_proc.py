"""The ext_proc gRPC servicer: receive, dispatch on the phase, reply. Nothing else.

Per-request logic lives in `extproc.request.flow`, protobuf building in `extproc.service.replies`
(and, with one ext_proc message per request, `extproc.service.one_message`).
Three ways Envoy may talk to it, told apart by the stream's first message: two messages
(headers, then the BUFFERED body: slogate's own configurations), one message (the body,
headers as metadata), and the endpoint picker protocol's streaming mode (a gateway's Envoy:
FULL_DUPLEX_STREAMED bodies, `protocol_config` on the first message), where the headers'
reply waits for the body's end, bodies go back as `streamed_response` chunks, and the
request ends with its stream (no access log comes): that mode lives in
`extproc.service.streamed_mode`, which this servicer opens per stream and lends its steps.
This module adds timing and the metrics of decisions and rejections, tells the request's
observers (extproc.service.observers: the tracer, the decision log, the traffic record) each
moment of its decision, and turns an unexpected exception into a 500 (a request is never
routed on a guess).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import InternalError, RequestRejected
from admission.waiting_room import WaitNotice
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.request.flow import Decider, RequestFlow
from extproc.request.response_usage import ResponseUsage
from extproc.request.verdicts import HeaderVerdict, Routed
from extproc.service.access_log import finish
from extproc.service.log_records import REQUEST_ID
from extproc.service.metrics import SidecarMetrics
from extproc.service.observers import RequestObserver
from extproc.service.one_message import forwarded_headers, headers_as_metadata
from extproc.service.outcomes import outcome_from_stream
from extproc.service.replies import (
    header_reply,
    headers_to_dict,
    jwt_claims,
    passthrough_reply,
    rejection,
    routed_body_reply,
    subset_hint,
    timeout_override,
    wait_reply_ms,
)
from extproc.service.streamed_mode import RequestEnds, StreamedExchange, streamed_exchange

log = logging.getLogger("slogate.extproc")


class ExternalProcessorService(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        decider: Decider,
        metrics: SidecarMetrics,
        observers: Sequence[RequestObserver] = (),
        message_timeout_ms: int = 1000,
        ends: RequestEnds | None = None,
    ) -> None:
        """`observers`: told each moment of every decision, in this order (the same ones
        are the access log's sinks: they see its answer too); `message_timeout_ms`:
        Envoy's (what a decision may take once its wait is over), part of a waiting
        request's timeout override (replies.wait_reply_ms); `ends`: where requests whose
        end their stream saw are recorded (streaming mode; None: they wait for the access
        log or expire)."""
        self._observers = tuple(observers)
        self._message_timeout_ms = message_timeout_ms
        self._decider = decider
        self._metrics = metrics
        self._ends = ends
        self._ending: set[asyncio.Task[None]] = set()

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        flow = self._decider.new_flow()
        exchange: StreamedExchange | None = None
        async for request in request_iterator:
            started = time.perf_counter()
            phase = request.WhichOneof("request")
            if phase is None:
                # Envoy names every message's phase; one without (a client that is not
                # Envoy) has no reply in kind: it gets the typed 500, not the catch-all's.
                unknown = InternalError(
                    "The gateway failed to process the request.", reason="unknown_ext_proc_message"
                )
                yield self._rejection(unknown, flow)
                continue
            if exchange is None and request.HasField("protocol_config"):
                exchange = streamed_exchange(request.protocol_config, self)
                if exchange is not None:
                    # The stream closing before the response ended (the client left, Envoy
                    # reset it) ends the request with what was seen; Envoy may also close
                    # it as soon as it has the last reply, before this generator resumes.
                    context.add_done_callback(functools.partial(exchange.closed, flow))
            if exchange is not None:
                async for reply in exchange.replies(flow, phase, request, started):
                    yield reply
            elif phase == "request_body":
                # The body's decision may wait for room in its pool: Envoy is told to wait.
                body = request.request_body.body
                async for reply in self._body_replies(flow, request, started, body):
                    yield reply
            else:
                reply = await self._answer(flow, phase, request)
                self._metrics.decision_seconds(phase).observe(time.perf_counter() - started)
                yield reply

    async def _answer(
        self,
        flow: RequestFlow,
        phase: str,
        request: pb.ProcessingRequest,
        on_wait: WaitNotice | None = None,
        body: bytes = b"",
    ) -> pb.ProcessingResponse:
        """The reply to one message; every error becomes the client's answer here."""
        try:
            if phase == "request_headers":
                return await self._headers_reply(flow, request)
            if phase == "request_body":
                return await self._body_reply(flow, request, on_wait, body)
            return passthrough_reply(request)
        except RequestRejected as error:
            return self._rejection(error, flow)
        except Exception:
            log.exception("ext_proc %s failed", phase)
            return self._rejection(
                InternalError("The gateway failed to process the request.", reason="internal"),
                flow,
            )

    async def _body_replies(
        self, flow: RequestFlow, request: pb.ProcessingRequest, started: float, body: bytes
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """The body's reply, preceded by a timeout override when the request waits in the
        waiting room: Envoy's message timeout stays short for a sidecar that hangs, and is
        lifted only for a request the sidecar itself holds, by as long as it may hold it
        plus a margin (replies.WAIT_REPLY_MARGIN_MS): the room's own 503 comes first even
        when a loaded machine starves the sidecar past the deadline. The decision time
        observed stops where a wait starts (slogate_wait_seconds has it)."""
        loop = asyncio.get_running_loop()
        waits: asyncio.Future[float] = loop.create_future()

        def notice(max_wait_s: float) -> None:
            if not waits.done():
                waits.set_result(max_wait_s)

        answer = loop.create_task(self._answer(flow, "request_body", request, notice, body))
        taken = False
        try:
            await asyncio.wait((answer, waits), return_when=asyncio.FIRST_COMPLETED)
            self._metrics.decision_seconds("request_body").observe(time.perf_counter() - started)
            if not answer.done():
                yield timeout_override(wait_reply_ms(waits.result(), self._message_timeout_ms))
            yield await answer
            taken = True  # grpc wrote it and asked for more
        finally:
            if not taken and answer.done() and not answer.cancelled():
                self._never_delivered(flow)
            # The stream is gone (the client left, Envoy reset it): the decision leaves the
            # waiting room now and gives back whatever it holds.
            # (Cancelled already when grpc cancelled this task while it awaited the answer.)
            gone = not answer.done() or answer.cancelled()
            if gone:
                answer.cancel()
                for observer in self._observers:
                    observer.abandoned(flow)

    def _never_delivered(self, flow: RequestFlow) -> None:
        """A decision whose stream ended before grpc asked for more: made while the stream
        was being reset (the client left while it waited, and the room let it in before
        grpc cancelled this stream; no access-log entry will name it), or taken by an Envoy
        that closed the stream at once (the request was over in a moment). Envoy's entry
        for the request tells which (extproc.service.undelivered); until it comes the
        decision stays in flight."""
        routed = flow.routed
        if routed is None or self._ends is None:
            return
        tracking = routed.tracking_id
        arrived_s = flow.arrived_s

        def outcome(decision: RoutingDecision) -> RequestOutcome:
            return outcome_from_stream(
                decision,
                tracking,
                0,
                ResponseUsage(),
                None,
                time.time() - arrived_s,
                "",
                "ext_proc_stream_closed",
            )

        ending = self._ends.maybe_undelivered(tracking, flow.request_id, outcome)
        if not ending:
            return
        task = asyncio.get_running_loop().create_task(finish(ending))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    def _rejection(self, error: RequestRejected, flow: RequestFlow) -> pb.ProcessingResponse:
        self._metrics.rejections(error.reason, str(error.status)).inc()
        log.debug("refused: %s (%d)", error.reason, error.status)
        for observer in self._observers:
            observer.refused(flow, error)
        return rejection(error, flow.error_style)

    async def _headers_reply(
        self, flow: RequestFlow, request: pb.ProcessingRequest
    ) -> pb.ProcessingResponse:
        flow.subset_hint = subset_hint(request)
        headers = request.request_headers
        verdict = await self._on_headers(
            flow, headers_to_dict(headers), headers.end_of_stream, request
        )
        reply = header_reply(verdict)
        if verdict.routed is not None:
            self._routed(flow, verdict.routed, reply)
        return reply

    async def _body_reply(
        self,
        flow: RequestFlow,
        request: pb.ProcessingRequest,
        on_wait: WaitNotice | None,
        body: bytes,
    ) -> pb.ProcessingResponse:
        # One message per request: no header message came, its headers are metadata
        # and its header phase runs now, on them (extproc.service.one_message).
        one_message = not flow.headers_seen
        if one_message:
            flow.subset_hint = subset_hint(request)
        forwarded = (
            await self._on_headers(flow, forwarded_headers(request), False, request)
            if one_message
            else None
        )
        routed: Routed | None
        if forwarded is not None and not forwarded.inference:
            # A path whose body is not read: its route sends the headers (routes.py), so
            # this is an operator's own route; it is decided on the headers as there.
            routed = forwarded.routed
        else:
            routed = await flow.on_request_body(body, on_wait)
        if routed is None:  # a public path's body
            return passthrough_reply(request)
        reply = routed_body_reply(routed, headers_in_metadata=one_message)
        self._routed(flow, routed, reply)
        if one_message:
            headers_as_metadata(reply)
        return reply

    async def _on_headers(
        self,
        flow: RequestFlow,
        fields: dict[str, str],
        end_of_stream: bool,
        request: pb.ProcessingRequest,
    ) -> HeaderVerdict:
        """The header phase, on the headers Envoy sent or forwarded as metadata."""
        # Log records written while this stream decides name its request (log_records).
        REQUEST_ID.set(fields.get("x-request-id"))
        for observer in self._observers:
            observer.arrived(flow, fields)
        return await flow.on_request_headers(fields, end_of_stream, jwt_claims(request))

    def _routed(self, flow: RequestFlow, routed: Routed, reply: pb.ProcessingResponse) -> None:
        """An admitted request: counted, and told to the observers (the tracer's span id
        goes upstream in the reply)."""
        decision = routed.decision
        self._count(decision)
        log.debug("routed: pool %s, bucket %s", decision.pool, decision.bucket.name)
        for observer in self._observers:
            observer.routed(flow, routed, reply)

    def _count(self, decision: RoutingDecision) -> None:
        self._metrics.decisions(
            decision.pool, decision.bucket.name, decision.caller.tier.value, decision.api.name
        ).inc()
        if decision.meters_tokens:
            self._metrics.context_tokens(decision.pool).observe(decision.context_tokens)
            self._metrics.prompt_counts(decision.estimate.value).inc()
