"""Hypothesis strategies for what reaches the sidecar's gRPC port: ext_proc streams and
access-log messages, either built at random from the fields the sidecar reads (paths,
keys, JSON bodies of every API's shape, metadata namespaces, modes) or mutated from the
real sequences of tooling.fuzz.seeds at the byte level (bit flips, truncation, splicing,
insertions, duplicated ranges). What comes out is bytes, sent as they are: the sidecar's
own deserializer meets what does not parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from extproc.envoypb.envoy.config.core.v3 import base_pb2
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import (
    ACCESS_LOG_NAME,
    DESTINATION_NAMESPACE,
    FORWARDED_NAMESPACE,
    JWT_AUTHN_NAMESPACE,
    JWT_PAYLOAD_KEY,
    METADATA_NAMESPACE,
    SERVED_KEY,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
    TRACKING_ID_FIELD,
)
from policy.apis import KNOWN_APIS
from tooling.fuzz.seeds import API_KEYS, ENGINE, ROUTED_ID, access_log_seeds, ext_proc_seeds

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


@dataclass(frozen=True, slots=True)
class StreamCase:
    """One ext_proc stream: its messages' bytes; `cancel_after`: the client resets the
    stream after that many replies (None: it half-closes and reads to the end)."""

    messages: tuple[bytes, ...]
    cancel_after: int | None
    origin: str  # "built" or "seed N mutated"


@dataclass(frozen=True, slots=True)
class LogCase:
    """One access-log stream: `routed` requests are decided first, and their ids replace
    the seeds' ROUTED_ID placeholders in the messages (those that still parse)."""

    messages: tuple[bytes, ...]
    routed: int
    origin: str


_EXT_PROC_SEEDS = [[m.SerializeToString() for m in seq] for seq in ext_proc_seeds()]
_LOG_SEEDS = [m.SerializeToString() for m in access_log_seeds()]
_ALL_SEED_BYTES = [m for seq in _EXT_PROC_SEEDS for m in seq] + _LOG_SEEDS

# -- JSON bodies -------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_counts = (
    st.integers(min_value=-5, max_value=2**63)
    | st.sampled_from([0, 1, 16, 4096, 200_000])
    | json_values
)
_roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | json_values
_content = (
    st.text(max_size=200)
    | st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["text", "image_url"]) | json_values,
                "text": st.text(max_size=60) | json_values,
            }
        ),
        max_size=3,
    )
    | json_values
)
_message = st.fixed_dictionaries(
    {"role": _roles, "content": _content}, optional={"name": json_values}
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["deepseek-v4", ""]) | json_values,
        "messages": st.lists(_message, max_size=4) | json_values,
        "prompt": st.text(max_size=200) | st.lists(st.text(max_size=20), max_size=3) | json_values,
        "input": st.text(max_size=200) | st.lists(st.text(max_size=20), max_size=3) | json_values,
        "system": st.text(max_size=50) | json_values,
        "max_tokens": _counts,
        "max_completion_tokens": _counts,
        "max_output_tokens": _counts,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries(
            {}, optional={"include_usage": st.booleans() | json_values}
        )
        | json_values,
        "n": _counts,
        "tools": json_values,
    },
)


def _json_bytes(document: Any) -> bytes:
    return json.dumps(document, allow_nan=True).encode()


bodies = (
    documents.map(_json_bytes)
    | json_values.map(_json_bytes)
    | st.binary(max_size=300)
    | st.sampled_from(
        [
            b"",
            b"[" * 20_000,  # nesting past any parser's depth
            b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
            b'{"model": "m", "messages": [], "max_tokens": 1e400}',
            b'{"a": 1, "a": 2}',
        ]
    )
)

# -- ext_proc messages built from their fields ----------------------------------------------

_paths = st.sampled_from(
    [api.path for api in KNOWN_APIS]
    + [
        "/health",
        "/",
        "/v1/chat/completions/",
        "/v1/chat/completions?x=1",
        "/V1/chat/completions",
        "//v1/../v1/models",
    ]
) | st.text(max_size=30)
_methods = st.sampled_from(["POST", "GET", "PUT", "OPTIONS"]) | st.text(max_size=8)
_auth = st.sampled_from(
    [f"Bearer {key}" for key in API_KEYS] + ["Bearer ", "Basic eDp5", "bearer sk-demo-standard"]
) | st.text(max_size=40)
_header_values: dict[str, st.SearchStrategy[str]] = {
    ":path": _paths,
    ":method": _methods,
    ":authority": st.just("slogate"),
    "authorization": _auth,
    "x-api-key": st.sampled_from(API_KEYS) | st.text(max_size=20),
    "content-type": st.sampled_from(["application/json", "text/plain"]),
    "content-length": st.integers(-1, 10**12).map(str) | st.text(max_size=5),
    "x-request-id": st.text(max_size=40),
    "traceparent": st.text(max_size=60),
    "anthropic-version": st.just("2023-06-01"),
    "x-slogate-pool": st.sampled_from(["long", "default"]),
    ":status": st.sampled_from(["200", "413", "503", "²", "-1", ""]) | st.text(max_size=4),
}


@st.composite
def _header_pairs(draw: st.DrawFn) -> list[base_pb2.HeaderValue]:
    names = draw(
        st.lists(st.sampled_from(sorted(_header_values)) | st.text(max_size=16), max_size=9)
    )
    out = []
    for name in names:
        text = draw(_header_values.get(name, st.text(max_size=20)))
        form = draw(st.sampled_from(["raw", "raw", "raw", "value", "bytes"]))
        if form == "raw":
            out.append(base_pb2.HeaderValue(key=name, raw_value=text.encode()))
        elif form == "value":
            out.append(base_pb2.HeaderValue(key=name, value=text))
        else:
            out.append(base_pb2.HeaderValue(key=name, raw_value=draw(st.binary(max_size=24))))
    return out


_struct_values = st.dictionaries(
    st.text(max_size=12),
    json_values.filter(lambda v: not isinstance(v, float) or v == v),
    max_size=4,
)
_namespaces: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    FORWARDED_NAMESPACE: st.fixed_dictionaries(
        {},
        optional={
            ":path": _paths,
            ":method": _methods,
            "authorization": _auth,
            "x-api-key": st.sampled_from(API_KEYS),
            "x-request-id": st.text(max_size=10),
        },
    ),
    SUBSET_HINT_NAMESPACE: st.fixed_dictionaries(
        {
            SUBSET_HINT_KEY: st.lists(
                st.sampled_from([ENGINE, "", ","]) | st.text(max_size=20), max_size=3
            )
            | st.text(max_size=30)
            | st.integers()
        }
    ),
    DESTINATION_NAMESPACE: st.fixed_dictionaries(
        {SERVED_KEY: st.sampled_from([ENGINE, ""]) | json_values}
    ),
    JWT_AUTHN_NAMESPACE: st.fixed_dictionaries({JWT_PAYLOAD_KEY: json_values}),
    METADATA_NAMESPACE: st.fixed_dictionaries({TRACKING_ID_FIELD: st.text(max_size=20)}),
}


def _finite(value: Any) -> Any:
    """Struct values are JSON: no NaN or infinity (protobuf's Struct refuses none, but keep
    what json.dumps would write)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return 0.0
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, int) and abs(value) > 2**53:
        return float(value)
    return value


@st.composite
def _metadata(draw: st.DrawFn, request: pb.ProcessingRequest) -> None:
    for name in draw(st.lists(st.sampled_from(sorted(_namespaces)), max_size=3, unique=True)):
        document = _finite(draw(_namespaces[name] | _struct_values))
        request.metadata_context.filter_metadata[name].update(document)


_PHASES = [
    "request_headers",
    "request_body",
    "request_trailers",
    "response_headers",
    "response_body",
    "response_trailers",
    "empty",
]


@st.composite
def built_message(draw: st.DrawFn, phase: str | None = None) -> pb.ProcessingRequest:
    """One ext_proc message of a phase (drawn when None), its fields drawn."""
    request = pb.ProcessingRequest()
    phase = phase or draw(st.sampled_from(_PHASES))
    if phase in ("request_headers", "response_headers"):
        message = getattr(request, phase)
        message.SetInParent()
        message.headers.headers.extend(draw(_header_pairs()))
        message.end_of_stream = draw(st.booleans())
    elif phase in ("request_body", "response_body"):
        message = getattr(request, phase)
        message.SetInParent()
        message.body = draw(bodies)
        message.end_of_stream = draw(st.booleans())
    elif phase != "empty":
        getattr(request, phase).trailers.headers.extend(draw(_header_pairs()))
    draw(_metadata(request))
    if draw(st.booleans()):
        config = request.protocol_config
        # Streaming mode half the time (the servicer's third way), else any, unknown too.
        config.request_body_mode = draw(st.sampled_from([_FULL_DUPLEX] * 7 + list(range(8))))
        config.response_body_mode = draw(st.sampled_from([_FULL_DUPLEX] * 7 + list(range(8))))
        config.send_body_without_waiting_for_header_response = draw(st.booleans())
    if draw(st.integers(0, 9)) == 0:
        request.observability_mode = True
    return request


# Bodies of the right types with values drawn: what gets past parsing to the decision
# (identity, counting, buckets, budgets, the KV step, the picker).
_text = st.text(max_size=300) | st.sampled_from(["hi", "é" * 50, "\u4f60\u597d" * 20, "a " * 2000])
_limit = st.integers(min_value=1, max_value=300_000)
_plausible_chat = st.fixed_dictionaries(
    {
        "model": st.just("deepseek-v4"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant"]), "content": _text}
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "max_tokens": _limit,
        "max_completion_tokens": _limit,
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "n": st.integers(1, 4),
        "temperature": st.floats(0, 2),
    },
)
_plausible_other = st.fixed_dictionaries(
    {"model": st.just("deepseek-v4")},
    optional={
        "prompt": _text,
        "input": _text | st.lists(_text, max_size=3),
        "max_tokens": _limit,
        "max_output_tokens": _limit,
        "stream": st.booleans(),
    },
)
_plausible = (_plausible_chat | _plausible_other).map(_json_bytes)
_api_paths = st.sampled_from([api.path for api in KNOWN_APIS])
_keys = st.sampled_from(API_KEYS)


@st.composite
def _shaped_request(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    """Headers then a body as Envoy sends them, their values drawn, mostly valid: reaches
    the decision."""
    first = pb.ProcessingRequest()
    fields = [
        (":path", draw(_api_paths if draw(st.integers(0, 9)) else _paths)),
        (":method", draw(st.sampled_from(["POST", "POST", "POST", "GET"]))),
        ("authorization", "Bearer " + draw(_keys) if draw(st.integers(0, 4)) else draw(_auth)),
        ("content-type", "application/json"),
        ("x-request-id", draw(st.text(max_size=8))),
    ]
    if draw(st.booleans()):
        fields.append(("anthropic-version", "2023-06-01"))
    for key, value in fields:
        first.request_headers.headers.headers.append(
            base_pb2.HeaderValue(key=key, raw_value=value.encode())
        )
    second = pb.ProcessingRequest()
    mostly = draw(st.integers(0, 9))
    second.request_body.body = draw(
        _plausible if mostly > 2 else documents.map(_json_bytes) | bodies
    )
    second.request_body.end_of_stream = True
    return [first, second]


@st.composite
def built_streams(draw: st.DrawFn) -> StreamCase:
    if draw(st.booleans()):
        messages = draw(_shaped_request())
        messages += draw(st.lists(built_message(), max_size=2))
    else:
        messages = draw(st.lists(built_message(), min_size=1, max_size=6))
    cancel = draw(st.none() | st.integers(0, 3))
    return StreamCase(tuple(m.SerializeToString() for m in messages), cancel, "built")


# -- byte-level mutations of real messages -----------------------------------------------

_mutation = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "truncate", "splice", "duplicate"]),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 16),
    st.binary(min_size=1, max_size=8),
)


def mutate(data: bytes, mutations: list[tuple[str, int, int, bytes]]) -> bytes:
    """`data` with each mutation applied in turn (positions wrap around its length)."""
    out = bytearray(data)
    for op, at, span, extra in mutations:
        size = len(out)
        where = at % (size + 1)
        length = 1 + span % 16
        if op == "flip" and size:
            out[where % size] ^= 1 << (span % 8)
        elif op == "set" and size:
            out[where % size] = extra[0]
        elif op == "delete":
            del out[where : where + length]
        elif op == "insert":
            out[where:where] = extra
        elif op == "truncate":
            del out[where:]
        elif op == "splice":
            donor = _ALL_SEED_BYTES[span % len(_ALL_SEED_BYTES)]
            start = at % (len(donor) + 1)
            out[where:where] = donor[start : start + 1 + extra[0]]
        elif op == "duplicate":
            out[where:where] = out[where : where + length]
    return bytes(out)


@st.composite
def mutated_streams(draw: st.DrawFn) -> StreamCase:
    index = draw(st.integers(0, len(_EXT_PROC_SEEDS) - 1))
    messages = list(_EXT_PROC_SEEDS[index])
    for position in draw(st.lists(st.integers(0, len(messages) - 1), min_size=1, max_size=3)):
        messages[position] = mutate(
            messages[position], draw(st.lists(_mutation, min_size=1, max_size=4))
        )
    shape = draw(st.sampled_from(["keep", "keep", "drop", "repeat", "swap"]))
    at = draw(st.integers(0, len(messages) - 1))
    if shape == "drop" and len(messages) > 1:
        del messages[at]
    elif shape == "repeat":
        messages.insert(at, messages[at])
    elif shape == "swap" and at + 1 < len(messages):
        messages[at], messages[at + 1] = messages[at + 1], messages[at]
    cancel = draw(st.none() | st.none() | st.integers(0, 3))
    return StreamCase(tuple(messages), cancel, f"seed {index} mutated")


ext_proc_streams = built_streams() | mutated_streams()

# -- access-log messages ----------------------------------------------------------------


@st.composite
def built_entry(draw: st.DrawFn) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.response.response_code.value = draw(
        st.integers(0, 2**32 - 1) | st.sampled_from([0, 200, 429, 503])
    )
    entry.response.response_code_details = draw(
        st.sampled_from(["via_upstream", "slogate_rate_limit", ""]) | st.text(max_size=20)
    )
    common = entry.common_properties
    if draw(st.booleans()):
        tracking = draw(
            st.sampled_from([ROUTED_ID.format(i) for i in range(3)]) | st.text(max_size=20)
        )
        common.metadata.filter_metadata[METADATA_NAMESPACE].update({TRACKING_ID_FIELD: tracking})
    if draw(st.booleans()):
        common.metadata.filter_metadata[METADATA_NAMESPACE].update(_finite(draw(_struct_values)))
    if draw(st.booleans()):
        seconds = draw(st.integers(-315_576_000_000, 315_576_000_000))
        common.duration.seconds = seconds
        common.duration.nanos = draw(st.integers(-999_999_999, 999_999_999)) if seconds else 0
    if draw(st.booleans()):
        common.time_to_last_downstream_tx_byte.seconds = draw(st.integers(-(10**6), 10**6))
    tag_names = st.sampled_from(
        [
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "cached_tokens",
            "reasoning_tokens",
            "ttft_ms",
            "stream_events",
        ]
    )
    tag_values = (
        st.sampled_from(
            ["-", "0", "7", "-3", "1e308", "inf", "nan", "1e400", "9" * 400, "0x10", " 5 "]
        )
        | st.integers().map(str)
        | st.text(max_size=12)
    )
    for name, value in draw(
        st.dictionaries(tag_names | st.text(max_size=10), tag_values, max_size=6)
    ).items():
        common.custom_tags[name] = value
    if draw(st.booleans()):
        address = common.upstream_remote_address.socket_address
        address.address = draw(
            st.sampled_from([ENGINE.split(":")[0], "::1", ""]) | st.text(max_size=20)
        )
        address.port_value = draw(st.integers(0, 2**32 - 1))
    flags = common.response_flags
    flags.upstream_remote_reset = draw(st.booleans())
    flags.upstream_request_timeout = draw(st.booleans())
    return entry


@st.composite
def built_logs(draw: st.DrawFn) -> LogCase:
    messages = []
    for _ in range(draw(st.integers(1, 3))):
        message = als_pb2.StreamAccessLogsMessage()
        if draw(st.booleans()):
            message.identifier.log_name = draw(st.just(ACCESS_LOG_NAME) | st.text(max_size=8))
        if draw(st.integers(0, 5)) == 0:
            message.tcp_logs.log_entry.add()
        else:
            message.http_logs.log_entry.extend(draw(st.lists(built_entry(), max_size=5)))
        messages.append(message.SerializeToString())
    return LogCase(tuple(messages), draw(st.integers(0, 3)), "built")


@st.composite
def mutated_logs(draw: st.DrawFn) -> LogCase:
    indexes = draw(st.lists(st.integers(0, len(_LOG_SEEDS) - 1), min_size=1, max_size=3))
    messages = [mutate(_LOG_SEEDS[i], draw(st.lists(_mutation, max_size=4))) for i in indexes]
    return LogCase(tuple(messages), draw(st.integers(0, 3)), f"seeds {indexes} mutated")


access_log_streams = built_logs() | mutated_logs()
