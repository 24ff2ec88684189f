"""What the fuzzer holds each reply to (tooling.fuzz.properties), on replies built here:
each kind of finding fires on its bad reply and not on the good ones."""

from __future__ import annotations

import json

from admission.errors import InternalError, RateLimited
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.service.replies import passthrough_reply, rejection, timeout_override
from tooling.fuzz.properties import stream_findings
from tooling.fuzz.seeds import CHAT, streamed, two_message

SENT = [m.SerializeToString() for m in two_message("/v1/chat/completions", "sk-x", CHAT)]
HEADERS, BODY = (pb.ProcessingRequest.FromString(m) for m in SENT)


def kinds(
    replies: list[pb.ProcessingResponse], status: str = "OK", sent: list[bytes] = SENT
) -> list[str]:
    raw = [r.SerializeToString() for r in replies]
    return [f.kind for f in stream_findings(sent, raw, status, cancelled=False)]


def test_answers_in_order_and_the_client_errors_pass() -> None:
    refused = rejection(RateLimited("slow down", reason="rate_limit", retry_after_s=2))
    assert kinds([passthrough_reply(HEADERS), refused]) == []
    wait = timeout_override(5000)  # the waiting room's override comes before the answer
    assert kinds([passthrough_reply(HEADERS), wait, passthrough_reply(BODY)]) == []


def test_a_wrong_phase_a_missing_answer_or_an_empty_reply_is_found() -> None:
    assert kinds([passthrough_reply(BODY), passthrough_reply(BODY)]) == ["phase_mismatch"]
    assert kinds([passthrough_reply(HEADERS)]) == ["reply_count"]
    assert kinds([passthrough_reply(HEADERS), pb.ProcessingResponse()]) == [
        "empty_reply",
        "reply_count",
    ]


def test_a_bad_refusal_or_the_catch_all_500_is_found() -> None:
    internal = rejection(InternalError("boom", reason="internal"))
    assert kinds([passthrough_reply(HEADERS), internal]) == ["internal_error"]
    not_json = rejection(RateLimited("slow down", reason="rate_limit"))
    not_json.immediate_response.body = b"<html>"
    assert kinds([passthrough_reply(HEADERS), not_json]) == ["immediate_body"]
    ok = rejection(RateLimited("slow down", reason="rate_limit"))
    ok.immediate_response.status.code = 200
    assert json.loads(ok.immediate_response.body)["error"]
    assert kinds([passthrough_reply(HEADERS), ok]) == ["immediate_status"]


def test_a_stream_that_fails_or_stalls_is_found_but_not_one_grpc_could_not_parse() -> None:
    assert kinds([], "UNKNOWN") == ["stream_error"]
    assert kinds([], "DEADLINE_EXCEEDED") == ["stall"]
    assert kinds([], "INTERNAL", sent=[b"\xff\xff\xff"]) == []


def test_streaming_mode_answers_any_phase_it_was_sent() -> None:
    sent = [m.SerializeToString() for m in streamed("/v1/chat/completions", "k", CHAT, [b"x"])]
    held_headers = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    body = pb.ProcessingResponse(request_body=pb.BodyResponse())
    assert kinds([body, held_headers, body], sent=sent) == []
    trailers = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    assert kinds([trailers], sent=sent) == ["phase_mismatch"]
