"""Speak to a sidecar the way Envoy does, without Envoy: for load tests and benchmarks.

What lives here: `SidecarDriver`, which opens one ext_proc `Process` stream per request
(request headers, then the buffered body, as Envoy 1.40 sends them with raw_value header
bytes) and sends access-log entries carrying the in-flight id and usage back on the
AccessLogService stream, with the proof of the id the sidecar gave (an entry without it
settles nothing: extproc.service.access_log). It lets a test hammer several real sidecar
processes at once far harder than one Envoy on two cores could.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from extproc.envoypb.envoy.config.core.v3 import base_pb2
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.request.contract import (
    ACCESS_LOG_NAME,
    METADATA_NAMESPACE,
    TRACKING_ID_FIELD,
    USAGE_PROOF_FIELD,
)


@dataclass(frozen=True, slots=True)
class DriverReply:
    status: int  # 200 when routed, else the immediate response's status
    tracking_id: str | None
    headers: dict[str, str]  # upstream headers set (routed) or response headers (refused)
    body: bytes
    usage_proof: str = ""  # of tracking_id, as the reply's metadata carried it

    def outcome(
        self, status: int, prompt: int | None, completion: int | None
    ) -> tuple[str, str, int, int | None, int | None]:
        """What `SidecarDriver.report` takes for this request's access-log entry."""
        return (self.tracking_id or "", self.usage_proof, status, prompt, completion)


def _headers_message(
    path: str, api_key: str, body: bytes, extra: Mapping[str, str] | None = None
) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    headers = request.request_headers.headers.headers
    for key, value in (
        (":method", "POST"),
        (":path", path),
        (":authority", "slogate"),
        ("authorization", f"Bearer {api_key}"),
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        *(extra or {}).items(),
    ):
        headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    return request


def access_log_entry(
    tracking: str,
    status: int,
    prompt: int | None,
    completion: int | None,
    duration_ms: int = 100,
    ttft_ms: int = 20,
    proof: str = "",
) -> accesslog_pb2.HTTPAccessLogEntry:
    """An entry as Envoy's access logger sends it for a routed request (see
    tooling.render.envoy_config for the tags it is configured with). `proof`: the id's, as
    the sidecar's reply put it in the metadata (Routed.usage_proof); "": an entry no Envoy
    of this sidecar wrote, which settles nothing."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.response.response_code.value = status
    entry.response.response_code_details = "via_upstream"
    entry.common_properties.duration.FromMilliseconds(duration_ms)
    entry.common_properties.metadata.filter_metadata[METADATA_NAMESPACE].update(
        {TRACKING_ID_FIELD: tracking, USAGE_PROOF_FIELD: proof}
    )
    tags = entry.common_properties.custom_tags
    tags["ttft_ms"] = str(ttft_ms)
    if prompt is not None:
        tags["prompt_tokens"] = str(prompt)
    if completion is not None:
        tags["completion_tokens"] = str(completion)
    return entry


class SidecarDriver:
    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                # Its own connection: drivers spread over `serve --workers N` as Envoys do.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self._processor = pb_grpc.ExternalProcessorStub(self._channel)
        self._access_log = als_pb2_grpc.AccessLogServiceStub(self._channel)

    async def decide(
        self,
        api_key: str,
        body: dict[str, object],
        path: str = "/v1/chat/completions",
        raw: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> DriverReply:
        """One request's headers and body; `raw`: these bytes instead of `body`'s JSON;
        `headers`: more request headers (x-request-id, traceparent, ...)."""
        raw = json.dumps(body).encode() if raw is None else raw
        body_message = pb.ProcessingRequest()
        body_message.request_body.body = raw
        body_message.request_body.end_of_stream = True
        call = self._processor.Process()
        await call.write(_headers_message(path, api_key, raw, headers))
        first = await call.read()
        if first.HasField("immediate_response"):
            await call.done_writing()
            return self._refused(first)
        await call.write(body_message)
        second = await call.read()
        await call.done_writing()
        if second.HasField("immediate_response"):
            return self._refused(second)
        mutation = second.request_body.response.header_mutation
        metadata = second.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
        return DriverReply(
            200,
            metadata[TRACKING_ID_FIELD].string_value,
            {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers},
            b"",
            metadata[USAGE_PROOF_FIELD].string_value,
        )

    @staticmethod
    def _refused(reply: pb.ProcessingResponse) -> DriverReply:
        immediate = reply.immediate_response
        headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
        return DriverReply(immediate.status.code, None, headers, immediate.body)

    async def report(
        self, outcomes: Sequence[tuple[str, str, int, int | None, int | None]], batch: int = 50
    ) -> None:
        """Access-log entries: (tracking id, its proof, status, prompt tokens, completion
        tokens), as `DriverReply.outcome` gives them."""
        await self.send(
            [
                access_log_entry(tracking, status, prompt, completion, proof=proof)
                for tracking, proof, status, prompt, completion in outcomes
            ],
            batch,
        )

    async def send(
        self, entries: Sequence[accesslog_pb2.HTTPAccessLogEntry], batch: int = 50
    ) -> None:
        """Access-log entries as they are, `batch` to a message."""
        messages = []
        for start in range(0, len(entries), batch):
            message = als_pb2.StreamAccessLogsMessage()
            message.identifier.log_name = ACCESS_LOG_NAME
            message.http_logs.log_entry.extend(entries[start : start + batch])
            messages.append(message)

        async def stream() -> object:
            for message in messages:
                yield message

        await self._access_log.StreamAccessLogs(stream())

    async def close(self) -> None:
        await self._channel.close()
