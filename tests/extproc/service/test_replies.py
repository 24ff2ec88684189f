"""The endpoint picker protocol's side of the ext_proc replies (extproc.service.replies):
what is read from the metadata Envoy forwards, and what a decision is told as."""

from __future__ import annotations

import dataclasses

from google.protobuf import struct_pb2

from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.verdicts import Routed
from extproc.service.replies import (
    STREAMED_CHUNK_BYTES,
    deferred_header_reply,
    routed_body_reply,
    served_endpoint,
    streamed_body,
    subset_hint,
)
from tests.support.decisions import decision


def with_metadata(namespace: str, key: str, value: object) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    fields = struct_pb2.Struct()
    fields.update({key: value})
    request.metadata_context.filter_metadata[namespace].CopyFrom(fields)
    return request


HINT = ("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset")


def test_the_subset_hint_is_read_as_a_list_or_a_comma_separated_string() -> None:
    assert subset_hint(pb.ProcessingRequest()) is None  # no hint: any engine
    assert subset_hint(with_metadata(*HINT, ["10.0.0.1:8000", "10.0.0.2:8000"])) == {
        "10.0.0.1:8000",
        "10.0.0.2:8000",
    }
    assert subset_hint(with_metadata(*HINT, "10.0.0.1:8000, 10.0.0.2:8000")) == {
        "10.0.0.1:8000",
        "10.0.0.2:8000",
    }
    assert subset_hint(with_metadata(*HINT, [])) == frozenset()  # allows none: a 503
    assert subset_hint(with_metadata(HINT[0], "other", ["10.0.0.1:8000"])) is None


def test_the_served_endpoint_is_read_from_envoy_lb() -> None:
    served = with_metadata("envoy.lb", "x-gateway-destination-endpoint-served", "10.0.0.2:8000")
    assert served_endpoint(served) == "10.0.0.2:8000"
    assert served_endpoint(pb.ProcessingRequest()) == ""


def routed(engines: tuple[str, ...], new_body: bytes | None = None) -> Routed:
    return Routed(dataclasses.replace(decision(100), engines=engines), "t-1", new_body)


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}


def test_the_engines_named_go_out_once_in_the_header_and_in_envoy_lb() -> None:
    reply = routed_body_reply(routed(("10.0.0.2:8000", "10.0.0.1:8000")))
    headers = set_headers(reply.request_body.response)
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert headers["x-gateway-destination-endpoint"] == "10.0.0.2:8000,10.0.0.1:8000"
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.2:8000,10.0.0.1:8000"
    assert "engine" not in reply.dynamic_metadata.fields["slogate"].struct_value.fields
    unpicked = routed_body_reply(routed(()))  # Envoy balances: nothing named
    assert "x-gateway-destination-endpoint" not in set_headers(unpicked.request_body.response)
    assert "envoy.lb" not in unpicked.dynamic_metadata.fields


def test_streaming_mode_answers_the_headers_with_the_decision_and_streams_the_body() -> None:
    body_reply = routed_body_reply(routed(("10.0.0.2:8000",), new_body=b'{"max_tokens": 8}'))
    reply = deferred_header_reply(body_reply)
    common = reply.request_headers.response
    headers = set_headers(common)
    assert common.clear_route_cache and headers["x-gateway-destination-endpoint"]
    assert "content-length" not in headers  # the body goes on chunked
    assert not common.HasField("body_mutation")
    assert reply.dynamic_metadata == body_reply.dynamic_metadata
    big = b"x" * (STREAMED_CHUNK_BYTES * 2 + 10)
    chunks = streamed_body("request_body", big, True)
    streamed = [c.request_body.response.body_mutation.streamed_response for c in chunks]
    assert b"".join(s.body for s in streamed) == big
    assert [s.end_of_stream for s in streamed] == [False, False, True]
    (empty,) = streamed_body("response_body", b"", False)
    assert not empty.response_body.response.body_mutation.streamed_response.end_of_stream


def test_a_request_to_settle_promptly_is_marked_for_the_unbatched_access_log() -> None:
    marked = dataclasses.replace(decision(100), settle_promptly=True)
    fields = routed_body_reply(Routed(marked, "t-1", None)).dynamic_metadata.fields
    assert fields["slogate"].struct_value.fields["settle_promptly"].bool_value is True
    plain = routed_body_reply(routed(())).dynamic_metadata.fields["slogate"].struct_value
    assert "settle_promptly" not in plain.fields
