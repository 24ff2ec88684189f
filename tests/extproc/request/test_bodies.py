"""Decoding every API's body: what is extracted, what is refused with which reason, and
the one place that rewrites a body before it goes upstream."""

from __future__ import annotations

import json

import pytest

from admission.errors import InvalidRequest
from extproc.request.bodies.parse import parse_inference_body
from extproc.request.bodies.request import InferenceRequest
from extproc.request.bodies.rewrite import rewritten_body
from policy.apis import BodyShape

CHAT = BodyShape.CHAT
COMPLETION = BodyShape.COMPLETION


def with_usage_requested(body: bytes, request: InferenceRequest) -> bytes | None:
    return rewritten_body(body, request)


def chat(**fields: object) -> bytes:
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return json.dumps(body).encode()


def test_chat_extracts_texts_max_tokens_and_stream() -> None:
    body = chat(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        ],
        max_completion_tokens=7,
        max_tokens=99,
        stream=True,
    )
    request = parse_inference_body(CHAT, body)
    assert request.prompt_texts[0] == "be brief" and request.prompt_texts[1] == "a"
    assert '"id"' in request.prompt_texts[2]
    assert request.max_tokens == 7  # max_completion_tokens wins, as in OpenAI's API
    assert request.stream and not request.wants_usage


def test_completions_prompt_forms() -> None:
    assert parse_inference_body(COMPLETION, b'{"prompt": "abc"}').prompt_texts == ("abc",)
    ids = parse_inference_body(COMPLETION, b'{"prompt": [1, 2, 3]}')
    assert ids.prompt_token_ids == 3 and ids.prompt_texts == ()
    many = parse_inference_body(COMPLETION, b'{"prompt": ["a", "b"], "max_tokens": 5}')
    assert many.prompt_texts == ("a", "b") and many.max_tokens == 5
    with pytest.raises(InvalidRequest):
        parse_inference_body(COMPLETION, b'{"prompt": ["a", 1]}')


@pytest.mark.parametrize(
    ("body", "reason", "fragment"),
    [
        (b"{not json", "malformed_json", "parse"),
        (b"", "malformed_json", "parse"),
        (b"\xff\xfe\x00", "malformed_json", "parse"),
        (b'{"messages": [{"role": "user", "content": "a\xffb"}]}', "malformed_json", "UTF-8"),
        (b"[" * 200_000 + b"]" * 200_000, "invalid_field", "object"),
        (b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "malformed_json", "nested"),
        (b'{"messages": "hello"}', "invalid_field", "$.messages"),
        (b'{"messages": []}', "invalid_field", "$.messages"),
        (b'{"model": "m"}', "invalid_field", "messages"),
        (chat(max_tokens=-1), "invalid_field", "$.max_tokens"),
        (chat(max_tokens=0), "invalid_field", "$.max_tokens"),
        (chat(max_tokens="10"), "invalid_field", "$.max_tokens"),
        (chat(max_tokens=True), "invalid_field", "$.max_tokens"),
        (chat(max_tokens=1.5), "invalid_field", "$.max_tokens"),
        (chat(stream="yes"), "invalid_field", "$.stream"),
        (b'{"messages": [{"content": "no role"}]}', "invalid_field", "role"),
        (b"null", "invalid_field", "object"),
    ],
)
def test_bad_bodies_are_invalid_requests(body: bytes, reason: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_inference_body(CHAT, body)
    assert info.value.reason == reason
    assert fragment in info.value.message
    assert info.value.status == 400


def test_huge_max_tokens_parses_and_is_left_to_the_context_check() -> None:
    request = parse_inference_body(CHAT, chat(max_tokens=10**30))
    assert request.max_tokens == 10**30


def test_usage_is_requested_for_streams_by_splicing() -> None:
    body = chat(stream=True)
    request = parse_inference_body(CHAT, body)
    new = with_usage_requested(body, request)
    assert new is not None
    decoded = json.loads(new)
    assert decoded["stream_options"] == {"include_usage": True}
    assert decoded["messages"] == json.loads(body)["messages"]


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}, {"other": 1}])
def test_existing_stream_options_are_merged_not_duplicated(options: object) -> None:
    body = chat(stream=True, stream_options=options)
    new = with_usage_requested(body, parse_inference_body(CHAT, body))
    assert new is not None
    assert new.count(b'"stream_options"') == 1
    merged = json.loads(new)["stream_options"]
    assert merged["include_usage"] is True
    if isinstance(options, dict):
        assert all(merged[k] == v for k, v in options.items() if k != "include_usage")


def test_no_mutation_when_not_needed() -> None:
    for body in (chat(), chat(stream=True, stream_options={"include_usage": True})):
        assert with_usage_requested(body, parse_inference_body(CHAT, body)) is None


def test_what_multiplies_generation_is_read() -> None:
    chat_n = parse_inference_body(CHAT, chat(n=4, max_tokens=10))
    assert chat_n.sequences == 4 and chat_n.max_tokens == 10
    best = parse_inference_body(COMPLETION, b'{"prompt": "a", "n": 2, "best_of": 5}')
    assert best.sequences == 5
    batch = parse_inference_body(COMPLETION, b'{"prompt": ["a", "b", "c"], "n": 2}')
    assert batch.sequences == 6  # one completion per prompt, n times each
    assert parse_inference_body(CHAT, chat(ignore_eos=True)).runs_to_limit
    assert parse_inference_body(CHAT, chat(min_tokens=50, max_tokens=50)).runs_to_limit
    assert not parse_inference_body(CHAT, chat(min_tokens=5, max_tokens=50)).runs_to_limit
    with pytest.raises(InvalidRequest, match=r"\$\.n"):
        parse_inference_body(CHAT, chat(n=0))


def test_responses_api_counts_input_items_instructions_and_tools() -> None:
    body = json.dumps(
        {
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x":1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "result"},
                {"role": "assistant", "content": "plain"},
            ],
            "tools": [{"type": "function", "name": "f"}],
            "max_output_tokens": 77,
            "stream": True,
        }
    ).encode()
    request = parse_inference_body(BodyShape.RESPONSES, body)
    assert request.prompt_texts[0] == "be brief"
    joined = "|".join(request.prompt_texts)
    for text in ("first", '{"x":1}', "result", "plain", '"function"'):
        assert text in joined
    assert "c1" not in joined  # ids are structure, not prompt
    assert request.max_tokens == 77 and request.stream
    plain = parse_inference_body(BodyShape.RESPONSES, b'{"input": "hello"}')
    assert plain.prompt_texts == ("hello",) and plain.max_tokens is None


@pytest.mark.parametrize(
    "field", [{"previous_response_id": "resp_1"}, {"background": True}, {"input": []}]
)
def test_responses_api_refuses_what_cannot_be_metered(field: dict[str, object]) -> None:
    body = json.dumps({"input": "hi", **field}).encode()
    with pytest.raises(InvalidRequest):
        parse_inference_body(BodyShape.RESPONSES, body)


def test_anthropic_messages_count_system_blocks_and_tool_results() -> None:
    body = json.dumps(
        {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "sys prompt"}],
            "messages": [
                {"role": "user", "content": "question"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "z"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "answer"}],
                },
            ],
        }
    ).encode()
    request = parse_inference_body(BodyShape.MESSAGES, body)
    joined = "|".join(request.prompt_texts)
    for text in ("sys prompt", "question", "answer", "z"):
        assert text in joined
    assert request.max_tokens == 64 and request.shape is BodyShape.MESSAGES
    with pytest.raises(InvalidRequest, match="max_tokens"):
        parse_inference_body(
            BodyShape.MESSAGES, b'{"messages": [{"role": "user", "content": "x"}]}'
        )


def test_embeddings_have_a_prompt_and_no_output() -> None:
    request = parse_inference_body(BodyShape.EMBEDDINGS, b'{"input": ["a", "bb"]}')
    assert request.prompt_texts == ("a", "bb") and not request.generates
    assert request.max_tokens is None


def test_invocations_are_told_apart_by_payload() -> None:
    assert parse_inference_body(BodyShape.INVOCATIONS, chat()).shape is BodyShape.CHAT
    completion = parse_inference_body(BodyShape.INVOCATIONS, b'{"prompt": "abc"}')
    assert completion.shape is BodyShape.COMPLETION
    with pytest.raises(InvalidRequest, match="messages"):
        parse_inference_body(BodyShape.INVOCATIONS, b'{"input": "abc"}')


@pytest.mark.parametrize(
    ("shape", "body", "member"),
    [
        (BodyShape.CHAT, b'{"messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
        (BodyShape.RESPONSES, b'{"input": "x"}', "max_output_tokens"),
        (
            BodyShape.CHAT,
            b'{"max_tokens": null, "messages": [{"role": "user", "content": "x"}]}',
            "max_tokens",
        ),
    ],
)
def test_the_charged_limit_is_written_once(shape: BodyShape, body: bytes, member: str) -> None:
    request = parse_inference_body(shape, body)
    new = rewritten_body(body, request, charged_max_tokens=300)
    assert new is not None and new.count(f'"{member}"'.encode()) == 1
    assert json.loads(new)[member] == 300
    named = parse_inference_body(shape, json.dumps({**json.loads(body), member: 5}).encode())
    assert rewritten_body(json.dumps({**json.loads(body), member: 5}).encode(), named, 300) is None


def test_model_rewrite_and_usage_together() -> None:
    body = chat(stream=True, max_tokens=3)
    new = rewritten_body(body, parse_inference_body(CHAT, body), 3, model="fallback")
    assert new is not None
    decoded = json.loads(new)
    assert decoded["model"] == "fallback" and decoded["stream_options"] == {"include_usage": True}
