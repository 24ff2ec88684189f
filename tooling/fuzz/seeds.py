"""Real message sequences, shaped as Envoy 1.40 sends them to slogate (ENVOY-NOTES, the
generated bootstrap and the endpoint picker's gateway): the fuzzer's starting points.

Each ext_proc seed is one stream's messages in order, for one of the three ways the
servicer is spoken to (two messages, one message with the headers as metadata, the
endpoint picker protocol's FULL_DUPLEX_STREAMED bodies). The access-log seeds name
in-flight ids by `ROUTED_ID` placeholders: the fuzzer puts ids the sidecar issued in their
place after mutating, so a mutated entry can settle a real request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from extproc.envoypb.envoy.config.core.v3 import base_pb2
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import (
    ACCESS_LOG_NAME,
    DESTINATION_NAMESPACE,
    FORWARDED_NAMESPACE,
    METADATA_NAMESPACE,
    SERVED_KEY,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
    TRACKING_ID_FIELD,
)

# The example policy's keys (deploy/policy.example.yaml), which the fuzz sidecar runs.
API_KEYS = ("sk-demo-standard", "sk-demo-critical", "sk-demo-batch", "sk-demo-small")
# Stands for the i-th id the sidecar issued before the access-log message is sent.
ROUTED_ID = "slogate-fuzz-routed-{}"
ENGINE = "10.0.0.7:8000"

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED

CHAT: dict[str, Any] = {
    "model": "deepseek-v4",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi in three languages."},
    ],
    "max_tokens": 32,
}
STREAMED_CHAT: dict[str, Any] = {**CHAT, "stream": True}
COMPLETION: dict[str, Any] = {
    "model": "deepseek-v4",
    "prompt": "Once upon a time",
    "max_tokens": 16,
}
EMBEDDING: dict[str, Any] = {"model": "deepseek-v4", "input": ["a", "few words"]}
MESSAGES: dict[str, Any] = {
    "model": "deepseek-v4",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Bonjour"}],
}
RESPONSES: dict[str, Any] = {"model": "deepseek-v4", "input": "hello", "max_output_tokens": 20}


def headers(
    fields: Sequence[tuple[str, str]], end_of_stream: bool = False, response: bool = False
) -> pb.ProcessingRequest:
    """A header message with raw_value bytes, as Envoy 1.40 sends them."""
    request = pb.ProcessingRequest()
    message = request.response_headers if response else request.request_headers
    message.end_of_stream = end_of_stream
    for key, value in fields:
        message.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    return request


def request_headers(
    path: str, key: str, body: bytes, method: str = "POST", extra: Sequence[tuple[str, str]] = ()
) -> pb.ProcessingRequest:
    return headers(
        [
            (":authority", "slogate"),
            (":path", path),
            (":method", method),
            (":scheme", "http"),
            ("authorization", f"Bearer {key}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("x-request-id", "5f0e4b8a-1c2d-4e5f-9a0b-c1d2e3f4a5b6"),
            *extra,
        ],
        end_of_stream=not body,
    )


def body(data: bytes, end_of_stream: bool = True, response: bool = False) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    message = request.response_body if response else request.request_body
    message.body = data
    message.end_of_stream = end_of_stream
    return request


def _encoded(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document).encode()


def two_message(path: str, key: str, document: Mapping[str, Any]) -> list[pb.ProcessingRequest]:
    """slogate's own configurations: the request headers, then the BUFFERED body."""
    data = _encoded(document)
    return [request_headers(path, key, data), body(data)]


def one_message(path: str, key: str, document: Mapping[str, Any]) -> list[pb.ProcessingRequest]:
    """`data_path.messages: one`: the body alone, the headers forwarded as metadata."""
    message = body(_encoded(document))
    forwarded = message.metadata_context.filter_metadata[FORWARDED_NAMESPACE]
    forwarded.update(
        {":path": path, ":method": "POST", "authorization": f"Bearer {key}", "x-request-id": "r1"}
    )
    return [message]


def streamed(
    path: str, key: str, document: Mapping[str, Any], response: Sequence[bytes]
) -> list[pb.ProcessingRequest]:
    """The endpoint picker protocol: the mode on the first message, the body in two chunks,
    the trailers, then the response with the endpoint that served, its body in chunks."""
    data = _encoded(document)
    first = request_headers(path, key, data)
    first.request_headers.end_of_stream = False
    first.protocol_config.request_body_mode = _FULL_DUPLEX
    first.protocol_config.response_body_mode = _FULL_DUPLEX
    hint = first.metadata_context.filter_metadata[SUBSET_HINT_NAMESPACE]
    hint.update({SUBSET_HINT_KEY: [ENGINE]})
    half = len(data) // 2
    trailers = pb.ProcessingRequest()
    trailers.request_trailers.SetInParent()
    answered = headers([(":status", "200"), ("content-type", "text/event-stream")], response=True)
    served = answered.metadata_context.filter_metadata[DESTINATION_NAMESPACE]
    served.update({SERVED_KEY: ENGINE})
    chunks = [body(c, i == len(response) - 1, response=True) for i, c in enumerate(response)]
    return [first, body(data[:half], False), body(data[half:], False), trailers, answered, *chunks]


SSE = [
    b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":21,"completion_tokens":3}}\n\ndata: [DONE]\n\n',
]


def ext_proc_seeds() -> list[list[pb.ProcessingRequest]]:
    standard, small = API_KEYS[0], API_KEYS[3]
    local_reply = [
        headers([(":status", "413"), ("content-type", "text/plain")], True, response=True)
    ]
    anthropic = [("x-api-key", standard), ("anthropic-version", "2023-06-01")]
    messages_data = _encoded(MESSAGES)
    # Streaming mode with the headers skipped: the body first, its headers as metadata.
    body_first = one_message("/v1/chat/completions", standard, CHAT)
    body_first[0].protocol_config.request_body_mode = _FULL_DUPLEX
    return [
        two_message("/v1/chat/completions", standard, CHAT),
        two_message("/v1/chat/completions", small, STREAMED_CHAT),
        two_message("/v1/completions", API_KEYS[1], COMPLETION),
        two_message("/v1/embeddings", API_KEYS[2], EMBEDDING),
        two_message("/v1/responses", standard, RESPONSES),
        [
            request_headers("/v1/messages", "", messages_data, extra=anthropic),
            body(messages_data),
        ],
        [request_headers("/v1/models", standard, b"", method="GET")],
        [request_headers("/health", "", b"", method="GET")],
        local_reply,
        one_message("/v1/chat/completions", standard, CHAT),
        streamed("/v1/chat/completions", standard, STREAMED_CHAT, SSE),
        body_first,
    ]


def access_log_entry(
    tracking: str | None, status: int, usage: Mapping[str, int | str], details: str = "via_upstream"
) -> accesslog_pb2.HTTPAccessLogEntry:
    """An entry as slogate's generated access logger sends it (tooling.render.envoy_config)."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.response.response_code.value = status
    entry.response.response_code_details = details
    common = entry.common_properties
    common.duration.FromMilliseconds(840)
    common.time_to_last_downstream_tx_byte.FromMilliseconds(838)
    host, port = ENGINE.split(":")
    common.upstream_remote_address.socket_address.address = host
    common.upstream_remote_address.socket_address.port_value = int(port)
    if tracking is not None:
        common.metadata.filter_metadata[METADATA_NAMESPACE].update({TRACKING_ID_FIELD: tracking})
    tags = common.custom_tags
    tags["ttft_ms"] = "120"
    tags["first_output_delay_ms"] = "30"
    tags["stream_events"] = "5"
    for name, value in usage.items():
        tags[name] = str(value)
    return entry


def access_log_seeds() -> list[als_pb2.StreamAccessLogsMessage]:
    def message(*entries: accesslog_pb2.HTTPAccessLogEntry) -> als_pb2.StreamAccessLogsMessage:
        out = als_pb2.StreamAccessLogsMessage()
        out.identifier.log_name = ACCESS_LOG_NAME
        out.http_logs.log_entry.extend(entries)
        return out

    openai = {"prompt_tokens": 21, "completion_tokens": 7, "cached_tokens": 0}
    anthropic = {"input_tokens": 9, "output_tokens": 4, "cache_read_input_tokens": 2}
    failed = access_log_entry(ROUTED_ID.format(1), 503, {}, "upstream_reset_before_response")
    failed.common_properties.response_flags.upstream_remote_reset = True
    return [
        message(access_log_entry(ROUTED_ID.format(0), 200, openai)),
        message(
            access_log_entry(ROUTED_ID.format(0), 200, anthropic),
            failed,
            access_log_entry(None, 413, {}, "request_payload_too_large"),
        ),
        message(access_log_entry(None, 404, {}, "route_not_found")),
    ]
