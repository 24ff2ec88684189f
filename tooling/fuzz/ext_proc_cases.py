"""Hypothesis strategies for ext_proc streams, built at random from the fields the sidecar
reads (paths, keys, JSON bodies of every API's shape, metadata namespaces, modes, phases),
or mutated from real ones (tooling.fuzz.mutation). What comes out is bytes, sent as they
are.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from extproc.envoypb.envoy.config.core.v3 import base_pb2
from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import (
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
from tooling.fuzz.cases import StreamCase
from tooling.fuzz.json_values import finite, json_values, struct_values
from tooling.fuzz.mutation import mutated_streams
from tooling.fuzz.seeds import API_KEYS, ENGINE

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED

# -- JSON bodies -------------------------------------------------------------------------

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


@st.composite
def _metadata(draw: st.DrawFn, request: pb.ProcessingRequest) -> None:
    for name in draw(st.lists(st.sampled_from(sorted(_namespaces)), max_size=3, unique=True)):
        document = finite(draw(_namespaces[name] | struct_values))
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


ext_proc_streams = built_streams() | mutated_streams()
