"""The simulated pool driven by the official SDKs: Anthropic's for the Messages API, OpenAI's
for the Responses API, streamed and not. Each SDK parses what the pool sends into its own
types (its stream helpers accumulate the events into a final object), so a field or an event
out of place fails here as it would for a user of the local stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    TextBlock,
    TextDelta,
)
from openai.types.responses import Response, ResponseOutputMessage, ResponseTextDeltaEvent

from extproc.runtime.processes import ManagedProcess, python_module
from sim.server._frames import filler_token

MODEL = "deepseek-v4"
EXACT = {"ignore_eos": True}  # vLLM's extension: exactly max_tokens come out


@pytest.fixture(scope="module")
def pool_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `python -m sim.server.pool` on a free loopback port."""
    argv = python_module("sim.server.pool", "--name", "sdk", "--port", "0", "--time-scale", "0.001")
    proc = ManagedProcess("pool-sdk", argv, Path(tmp_path_factory.mktemp("sdk"))).start()
    try:
        ready = proc.wait_for_line(r"listening on (http://127\.0\.0\.1:\d+)", timeout_s=30)
        yield ready.group(1)
    finally:
        proc.stop()


@pytest.fixture
def claude(pool_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=pool_url, api_key="x", max_retries=0, timeout=30)


@pytest.fixture
def gpt(pool_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pool_url}/v1", api_key="x", max_retries=0, timeout=30)


def text_of(tokens: int) -> str:
    return "".join(filler_token(i) for i in range(tokens))


def prompt_of(message: Message) -> int:
    """Anthropic's whole prompt: `input_tokens` leaves the cache out."""
    usage = message.usage
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


def test_anthropic_sdk_reads_a_message_and_its_cached_prompt(claude: anthropic.Anthropic) -> None:
    # 40 bytes and 8 bytes of text, each ceil(bytes / 4) + 4 tokens in the simulator.
    def ask() -> Message:
        return claude.messages.create(
            model=MODEL,
            max_tokens=5,
            system="s" * 40,
            messages=[{"role": "user", "content": "u" * 8}],
            extra_body=EXACT,
        )

    first = ask()
    assert isinstance(first, Message) and first.type == "message" and first.role == "assistant"
    assert first.model == MODEL and first.id.startswith("chatcmpl-")  # vLLM keeps chat's id
    [block] = first.content
    assert isinstance(block, TextBlock) and block.text == text_of(5)
    assert (first.stop_reason, first.stop_sequence) == ("max_tokens", None)
    assert (first.usage.input_tokens, first.usage.output_tokens) == (14 + 6, 5)
    assert first.usage.cache_read_input_tokens == 0 == first.usage.cache_creation_input_tokens

    again = ask()
    assert again.usage.cache_read_input_tokens == 20  # the whole prompt, seen before
    assert again.usage.input_tokens == 0
    assert prompt_of(again) == prompt_of(first) == 20


def test_anthropic_sdk_streams_a_message(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=MODEL,
        max_tokens=7,
        messages=[{"role": "user", "content": "stream to the sdk"}],
        extra_body=EXACT,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(7)
    assert isinstance(final, Message) and final.id.startswith("chatcmpl-")
    [block] = final.content
    assert isinstance(block, TextBlock) and block.text == text
    assert final.stop_reason == "max_tokens"
    # ceil(17 / 4) + 4 prompt tokens, not cached before; the output counted to the end.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 7)
    assert final.usage.cache_read_input_tokens == 0


def test_anthropic_sdk_sees_vllm_event_sequence(claude: anthropic.Anthropic) -> None:
    raw = claude.messages.create(
        model=MODEL,
        max_tokens=3,
        messages=[{"role": "user", "content": "events, raw"}],
        stream=True,
        extra_body=EXACT,
    )
    events = list(raw)
    kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # no ping: vLLM sends none
    start, block_start, *deltas = events[:5]
    assert isinstance(start, RawMessageStartEvent)
    assert (start.message.usage.input_tokens, start.message.usage.output_tokens) == (7, 0)
    assert start.message.content == [] and start.message.stop_reason is None
    assert isinstance(block_start, RawContentBlockStartEvent)
    assert isinstance(block_start.content_block, TextBlock)
    assert block_start.content_block.text == ""  # the SDK's stream appends to it
    assert all(isinstance(d, RawContentBlockDeltaEvent) for d in deltas)
    texts = [d.delta for d in deltas if isinstance(d, RawContentBlockDeltaEvent)]
    assert "".join(t.text for t in texts if isinstance(t, TextDelta)) == text_of(3)
    message_delta = events[-2]
    assert isinstance(message_delta, RawMessageDeltaEvent)
    assert message_delta.delta.stop_reason == "max_tokens"
    assert (message_delta.usage.input_tokens, message_delta.usage.output_tokens) == (7, 3)


def test_openai_sdk_reads_a_response(gpt: openai.OpenAI) -> None:
    response = gpt.responses.create(
        model=MODEL,
        input="answer me, sdk",  # ceil(14 / 4) + 4 tokens
        instructions="briefly",  # ceil(7 / 4) + 4 tokens
        max_output_tokens=6,
        temperature=0.25,
        extra_body=EXACT,
    )
    assert isinstance(response, Response) and response.id.startswith("resp_")
    assert response.output_text == text_of(6)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert (response.instructions, response.temperature) == ("briefly", 0.25)
    assert response.max_output_tokens == 6 and response.model == MODEL
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (14, 6, 20)
    assert usage.input_tokens_details.cached_tokens == 0


def test_openai_sdk_streams_a_response(gpt: openai.OpenAI) -> None:
    with gpt.responses.stream(
        model=MODEL, input="stream a response", max_output_tokens=4, extra_body=EXACT
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",  # vLLM's type, though the status is incomplete
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert "".join(e.delta for e in deltas) == text_of(4)
    [item] = final.output
    assert isinstance(item, ResponseOutputMessage) and item.id.startswith("msg_")
    assert {(e.item_id, e.output_index, e.content_index) for e in deltas} == {(item.id, 0, 0)}
    assert final.output_text == text_of(4) and final.status == "incomplete"
    assert final.usage is not None
    # ceil(17 / 4) + 4 prompt tokens.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 4)
    assert final.usage.total_tokens == 13
