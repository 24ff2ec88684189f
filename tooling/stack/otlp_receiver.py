"""An OTLP/gRPC trace receiver: what a collector does with slogate's spans, in one object.

What lives here: `TraceReceiver`, a real grpcio server implementing opentelemetry-proto's
TraceService on loopback (port 0 by default), which keeps every span it is sent as a
`ReceivedSpan`. The tests point `telemetry.tracing.otlp_endpoint` at it; `slogate bench
tracing` uses it as the collector. Needs the `tracing` extra (opentelemetry-proto).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits, as in a traceparent
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    service: str  # the resource's service.name
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error (opentelemetry-proto's Status.StatusCode)


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.exports = 0  # Export calls answered (batches)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)]
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.endpoint = f"{host}:{self.port}"

    def start(self) -> TraceReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1.0).wait()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            service=str(service),
                            attributes=_attributes(span.attributes),
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self._spans.extend(received)
            self.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, count: int, timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """The spans once at least `count` arrived (the exporter sends in batches), or what
        arrived by `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while len(self.spans()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans()
