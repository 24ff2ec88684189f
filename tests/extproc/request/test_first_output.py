"""Which chunk of a response carries its first output event, for every API's stream (the
simulator's vLLM-shaped events: tests/e2e/test_sim_matches_vllm_events.py holds them to a
real vLLM), however the stream is cut into chunks."""

from __future__ import annotations

import json

import pytest

from extproc.request.first_output import FirstOutput
from sim.server._event_frames import MessagesFrame, ResponsesFrame
from sim.server._frames import Frame, OpenAiFrame
from sim.server._wire import Usage

FRAMES = {
    "chat": lambda: OpenAiFrame(True, "chatcmpl-1", "m", 0),
    "completions": lambda: OpenAiFrame(False, "cmpl-1", "m", 0),
    "responses": lambda: ResponsesFrame("resp_1", "m", 16, {"metadata": {"text": "not output"}}),
    "messages": lambda: MessagesFrame("chatcmpl-1", "m", 5),
}


def stream(frame: Frame) -> tuple[bytes, bytes]:
    """(what is sent before the first token, the first token's events and the rest)."""
    before = frame.stream_head() + frame.stream_open(True)
    after = frame.stream_token("Hi", True) + frame.stream_token(" there", True, "stop")
    return before, after + frame.stream_close("stop", Usage(5, 2), True)


def first_output_at(chunks: list[bytes]) -> int | None:
    watch = FirstOutput()
    fired = [i for i, chunk in enumerate(chunks) if watch.feed(chunk)]
    assert len(fired) <= 1
    return fired[0] if fired else None


@pytest.mark.parametrize("api", list(FRAMES))
def test_the_first_output_event_is_the_first_token_not_the_first_byte(api: str) -> None:
    before, after = stream(FRAMES[api]())
    if api == "responses":
        assert b"response.created" in before and b'"text":"not output"' in before
    assert first_output_at([before, after]) == 1  # `before` is empty for completions


@pytest.mark.parametrize("api", list(FRAMES))
def test_a_marker_split_across_chunks_is_found_at_the_byte_that_completes_it(api: str) -> None:
    before, after = stream(FRAMES[api]())
    whole = before + after
    at = first_output_at([whole[i : i + 1] for i in range(len(whole))])
    assert at is not None and len(before) <= at < len(before) + len(after)


def test_chat_opening_role_chunk_alone_is_not_output() -> None:
    frame = OpenAiFrame(True, "chatcmpl-1", "m", 0)
    assert first_output_at([frame.stream_open(False)]) is None


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "Let me"},
        {"reasoning": "Let me"},
        {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]},
    ],
)
def test_chat_reasoning_and_tool_calls_are_output(delta: dict[str, object]) -> None:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    assert first_output_at([b"data: " + json.dumps(chunk).encode() + b"\n\n"]) == 0


@pytest.mark.parametrize(
    "kind", ["response.reasoning_text.delta", "response.function_call_arguments.delta"]
)
def test_responses_reasoning_and_tool_call_deltas_are_output(kind: str) -> None:
    frame = ResponsesFrame("resp_1", "m", 16)
    event = b"event: " + kind.encode() + b'\ndata: {"delta":"x","type":"' + kind.encode() + b'"}'
    assert first_output_at([frame.stream_head(), event + b"\n\n"]) == 1


def test_a_json_answer_has_no_output_event() -> None:
    frame = OpenAiFrame(True, "chatcmpl-1", "m", 0)
    assert first_output_at([frame.full_response("Hello", "stop", Usage(5, 1))]) is None


def test_escaped_text_in_an_opening_event_is_not_output() -> None:
    settings = {"instructions": 'say "content":"x" and "type":"response.output_text.delta"'}
    frame = ResponsesFrame("resp_1", "m", 16, settings)
    assert first_output_at([frame.stream_head()]) is None
