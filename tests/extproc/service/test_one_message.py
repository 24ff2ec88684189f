"""The sidecar's side of one ext_proc message per request (extproc.service.one_message), on
the protobuf messages themselves: headers read from forwarded metadata, and a body reply's
header mutations moved to the metadata the pool routes render."""

from __future__ import annotations

import dataclasses

import pytest

from admission.errors import InternalError
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import FORWARDED_NAMESPACE, METADATA_NAMESPACE, POOL_FIELD
from extproc.request.verdicts import Routed
from extproc.service.one_message import forwarded_headers, headers_as_metadata
from extproc.service.replies import routed_body_reply, set_headers
from tests.support.decisions import decision


def body_message(forwarded: dict[str, str] | None) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    request.request_body.body = b"{}"
    if forwarded is not None:
        fields = request.metadata_context.filter_metadata[FORWARDED_NAMESPACE].fields
        for name, value in forwarded.items():
            fields[name].string_value = value
    return request


def test_the_forwarded_headers_are_the_requests_headers() -> None:
    sent = {":path": "/v1/chat/completions", ":method": "POST", "authorization": "Bearer k"}
    assert forwarded_headers(body_message(sent)) == sent


def test_a_body_without_headers_or_forwarded_headers_is_refused() -> None:
    with pytest.raises(InternalError) as refused:
        forwarded_headers(body_message(None))
    assert refused.value.reason == "headers_not_forwarded"


def test_a_routed_body_reply_carries_its_headers_as_metadata() -> None:
    reply = pb.ProcessingResponse()
    common = reply.request_body.response
    set_headers(common.header_mutation, {"x-slogate-tenant": "t", "content-length": "12"})
    common.clear_route_cache = True
    fields = reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
    fields[POOL_FIELD].string_value = "default"
    headers_as_metadata(reply)
    fields = reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
    assert fields["x-slogate-tenant"].string_value == "t"
    assert fields["content-length"].string_value == "12"
    assert fields[POOL_FIELD].string_value == "default"  # what was there stays
    # Nothing is set on headers Envoy no longer has, yet the mutation is not empty: Envoy
    # ignores clear_route_cache without one.
    assert not common.header_mutation.set_headers
    assert list(common.header_mutation.remove_headers)
    assert common.clear_route_cache


def test_a_reply_that_routes_nothing_is_left_alone() -> None:
    reply = pb.ProcessingResponse()
    reply.request_body.SetInParent()
    headers_as_metadata(reply)
    assert not reply.HasField("dynamic_metadata")
    assert not reply.request_body.response.HasField("header_mutation")


def test_a_routed_reply_built_with_its_headers_in_metadata_is_the_moved_one() -> None:
    # The one-message reply is built with its headers in metadata at once: what Envoy gets
    # is what moving the two-message reply's headers gives (an observer's header too).
    routed = Routed(
        dataclasses.replace(decision(100), engines=("10.0.0.2:8000",)),
        "t-1",
        b'{"max_tokens": 8}',
        {"x-ratelimit-remaining-tokens": "90"},
        upstream_headers={"x-slogate-crossed": "eu"},
    )
    moved = routed_body_reply(routed)
    built = routed_body_reply(routed, headers_in_metadata=True)
    for reply in (moved, built):
        set_headers(reply.request_body.response.header_mutation, {"traceparent": "00-ab-cd-01"})
        headers_as_metadata(reply)
    assert built == moved
    fields = built.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
    assert fields["content-length"].string_value == "17"
    assert fields["x-slogate-crossed"].string_value == "eu"
    assert fields["traceparent"].string_value == "00-ab-cd-01"
