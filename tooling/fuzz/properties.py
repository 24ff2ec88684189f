"""What every exchange at the sidecar's door must hold, pure (no I/O): a stream is
answered or closed, each reply is an ext_proc ProcessingResponse that answers the phase it
was sent for, an immediate response is a client's JSON error with a 4xx/5xx status, and an
unexpected exception (a 500 `internal`, an error record) is never the answer.

A finding is (kind, detail); the kinds are the names a run counts by.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.envoypb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import REASON_HEADER

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    detail: str


def parsed(data: bytes) -> pb.ProcessingRequest | None:
    """`data` as the sidecar's deserializer reads it; None where it does not parse."""
    try:
        return pb.ProcessingRequest.FromString(data)
    except Exception:  # DecodeError, and upb's RuntimeError on some nestings
        return None


def _streaming(requests: Sequence[pb.ProcessingRequest]) -> bool:
    """The endpoint picker protocol's mode: a message said the request body streams full
    duplex (the servicer's rule: extproc.service.streamed_mode.streamed_exchange)."""
    return any(
        r.HasField("protocol_config") and r.protocol_config.request_body_mode == _FULL_DUPLEX
        for r in requests
    )


def immediate_findings(immediate: pb.ImmediateResponse) -> list[Finding]:
    """A refusal the client reads: 4xx/5xx, JSON with an error object (OpenAI's shape, or
    Anthropic's for /v1/messages: both have error.type and error.message), never the
    catch-all of an unexpected exception."""
    found = []
    status = immediate.status.code
    if not 400 <= status <= 599:
        found.append(Finding("immediate_status", f"status {status}"))
    headers = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
    if headers.get("content-type") != b"application/json":
        found.append(Finding("immediate_body", f"content-type {headers.get('content-type')!r}"))
    try:
        error = json.loads(immediate.body)["error"]
        if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
            raise TypeError("error.message or error.type is not a string")
    except (ValueError, KeyError, TypeError, AttributeError) as problem:
        found.append(Finding("immediate_body", f"{problem}: {immediate.body[:200]!r}"))
    if headers.get(REASON_HEADER) == b"internal":
        found.append(Finding("internal_error", immediate.body.decode("utf-8", "replace")[:200]))
    return found


def stream_findings(
    sent: Sequence[bytes], replies: Sequence[bytes], status: str, cancelled: bool
) -> list[Finding]:
    """One ext_proc stream: `sent` as the client sent it, `replies` as read, `status` how it
    ended (grpc's code name), `cancelled` when the client reset it itself."""
    found: list[Finding] = []
    requests = [parsed(data) for data in sent]
    decodable = [r for r in requests if r is not None]
    all_decodable = len(decodable) == len(requests)
    if status == "DEADLINE_EXCEEDED":
        found.append(Finding("stall", f"{len(replies)} replies to {len(sent)} messages"))
    elif status not in ("OK", "CANCELLED") and all_decodable:
        found.append(Finding("stream_error", status))
    elif status == "CANCELLED" and not cancelled:
        found.append(Finding("stream_error", "cancelled by the server"))
    phases = [r.WhichOneof("request") for r in decodable]
    answers = []
    for data in replies:
        try:
            reply = pb.ProcessingResponse.FromString(data)
        except Exception:
            found.append(Finding("unparseable_reply", repr(data[:80])))
            continue
        which = reply.WhichOneof("response")
        if which is None:
            if not reply.HasField("override_message_timeout"):
                found.append(Finding("empty_reply", str(reply)[:200]))
            continue  # the waiting room's timeout override: the answer follows
        if which == "immediate_response":
            found.extend(immediate_findings(reply.immediate_response))
        answers.append(which)
    if _streaming(decodable):
        # Streaming mode holds the headers' answer until the body ends and hands bodies
        # back in chunks: each answer is still for a phase this stream sent.
        for which in answers:
            if which != "immediate_response" and which not in phases:
                found.append(Finding("phase_mismatch", f"{which} on a stream of {phases}"))
        return found
    # One answer per message, in order, for that message's phase (or the client's error).
    for which, phase in zip(answers, phases, strict=False):
        if which not in (phase, "immediate_response"):
            found.append(Finding("phase_mismatch", f"{which} for {phase}"))
    if status == "OK" and all_decodable and len(answers) != len(phases):
        found.append(Finding("reply_count", f"{len(answers)} answers to {len(phases)} messages"))
    return found
