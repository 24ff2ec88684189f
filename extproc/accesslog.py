"""The response path: one access-log entry per request, turned into a `RequestOutcome`.

What lives here: `outcome_from_entry` (pure: protobuf entry -> outcome), `OutcomeRecorder`
(metrics + latency windows + any later sinks such as budget settlement) and the grpc.aio
`AccessLogService` that Envoy streams batched entries to. Python never sees response
chunks: usage and timings were extracted inside Envoy (see usage_tap.lua).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from google.protobuf import struct_pb2

from breaker.latency import ResponseWindows
from extproc.contract import METADATA_NAMESPACE
from extproc.metrics import SidecarMetrics

log = logging.getLogger("slogate.accesslog")


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    request_id: str
    key_id: str
    tenant: str
    tier: str
    pool: str
    bucket: str
    status: int
    prompt_tokens_est: int
    max_tokens: int
    prompt_tokens: int | None  # from upstream usage; None when the response had none
    completion_tokens: int | None
    ttft_s: float | None  # None when no response body byte arrived
    duration_s: float
    details: str

    @property
    def has_usage(self) -> bool:
        return self.completion_tokens is not None


class OutcomeSink(Protocol):
    """Something that needs each finished request (budget settlement, the breaker)."""

    def record(self, outcome: RequestOutcome) -> None: ...


def _tag_int(tags: Mapping[str, str], name: str) -> int | None:
    value = tags.get(name, "")
    try:
        number = int(float(value))
    except ValueError:
        return None  # "-" (absent) or garbage: treat as not reported
    return number if number >= 0 else None


def _tag_ms(tags: Mapping[str, str], name: str) -> float | None:
    value = _tag_int(tags, name)
    return None if value is None else value / 1000.0


def _meta_text(fields: Mapping[str, struct_pb2.Value], name: str) -> str:
    value = fields.get(name)
    return value.string_value if value is not None else ""


def _meta_int(fields: Mapping[str, struct_pb2.Value], name: str) -> int:
    value = fields.get(name)
    return int(value.number_value) if value is not None else 0


def outcome_from_entry(entry: accesslog_pb2.HTTPAccessLogEntry) -> RequestOutcome | None:
    """The outcome of a request the sidecar routed; None for any other request."""
    common = entry.common_properties
    if METADATA_NAMESPACE not in common.metadata.filter_metadata:
        return None
    # Direct field reads: json_format.MessageToDict cost ~40 us per entry.
    meta = common.metadata.filter_metadata[METADATA_NAMESPACE].fields
    tags = common.custom_tags
    duration_s = common.duration.ToNanoseconds() / 1e9 if common.HasField("duration") else 0.0
    if duration_s == 0.0 and common.HasField("time_to_last_downstream_tx_byte"):
        duration_s = common.time_to_last_downstream_tx_byte.ToNanoseconds() / 1e9
    return RequestOutcome(
        request_id=_meta_text(meta, "request_id"),
        key_id=_meta_text(meta, "key_id"),
        tenant=_meta_text(meta, "tenant"),
        tier=_meta_text(meta, "tier"),
        pool=_meta_text(meta, "pool"),
        bucket=_meta_text(meta, "bucket"),
        status=entry.response.response_code.value,
        prompt_tokens_est=_meta_int(meta, "prompt_tokens_est"),
        max_tokens=_meta_int(meta, "max_tokens"),
        prompt_tokens=_tag_int(tags, "prompt_tokens"),
        completion_tokens=_tag_int(tags, "completion_tokens"),
        ttft_s=_tag_ms(tags, "ttft_ms"),
        duration_s=duration_s,
        details=entry.response.response_code_details,
    )


def _code_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


class OutcomeRecorder:
    """Feeds each outcome to metrics, the latency windows and the registered sinks."""

    def __init__(
        self,
        metrics: SidecarMetrics,
        windows: ResponseWindows,
        sinks: Sequence[OutcomeSink] = (),
    ) -> None:
        self.metrics = metrics
        self.windows = windows
        self.sinks = list(sinks)

    def record_entry(self, entry: accesslog_pb2.HTTPAccessLogEntry) -> None:
        outcome = outcome_from_entry(entry)
        if outcome is None:
            self.metrics.access_log_entries("other").inc()
            status = entry.response.response_code.value
            details = entry.response.response_code_details
            if status >= 400 and details != "via_upstream" and not details.startswith("slogate_"):
                # Envoy answered itself (413 over the buffer limit, 503 sidecar down, ...).
                self.metrics.envoy_local_replies(str(status)).inc()
            return
        self.metrics.access_log_entries("routed").inc()
        self.record(outcome)

    def record(self, outcome: RequestOutcome) -> None:
        m = self.metrics
        m.responses(outcome.pool, _code_class(outcome.status)).inc()
        self.windows.record_response(outcome.pool, outcome.status)
        if outcome.status < 400:
            labels = (outcome.pool, outcome.bucket, outcome.tier)
            m.duration_seconds(*labels).observe(outcome.duration_s)
            self.windows.record_latency("total", *labels, outcome.duration_s)
            if outcome.ttft_s is not None:
                m.ttft_seconds(*labels).observe(outcome.ttft_s)
                self.windows.record_latency("ttft", *labels, outcome.ttft_s)
            self._record_usage(outcome)
        for sink in self.sinks:
            try:
                sink.record(outcome)
            except Exception:  # one broken sink must not starve the others
                log.exception("outcome sink %r failed", sink)

    def _record_usage(self, outcome: RequestOutcome) -> None:
        m = self.metrics
        if outcome.prompt_tokens is not None:
            m.tokens(outcome.pool, outcome.bucket, "prompt").inc(outcome.prompt_tokens)
            if outcome.prompt_tokens > 0:
                m.estimate_ratio.observe(outcome.prompt_tokens_est / outcome.prompt_tokens)
        if outcome.completion_tokens is None:
            m.usage_missing(outcome.pool).inc()
            return
        m.tokens(outcome.pool, outcome.bucket, "completion").inc(outcome.completion_tokens)
        if outcome.ttft_s is not None and outcome.completion_tokens > 1:
            tpot_s = (outcome.duration_s - outcome.ttft_s) / (outcome.completion_tokens - 1)
            if tpot_s >= 0:
                m.tpot_seconds(outcome.pool, outcome.bucket).observe(tpot_s)
                self.windows.record_latency(
                    "tpot", outcome.pool, outcome.tier, outcome.bucket, tpot_s
                )


class AccessLogService(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self, recorder: OutcomeRecorder) -> None:
        self._recorder = recorder

    async def StreamAccessLogs(
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext,
    ) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                try:
                    self._recorder.record_entry(entry)
                except Exception:  # a malformed entry must not end the stream for the rest
                    log.exception("could not record an access-log entry")
        return als_pb2.StreamAccessLogsResponse()
