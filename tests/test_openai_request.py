"""Decoding OpenAI bodies: what is extracted, and what is refused with which reason."""

from __future__ import annotations

import json

import pytest

from extproc.errors import InvalidRequest
from extproc.openai_request import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    parse_inference_body,
    with_usage_requested,
)


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
    request = parse_inference_body(CHAT_PATH, body)
    assert request.prompt_texts[0] == "be brief" and request.prompt_texts[1] == "a"
    assert '"id"' in request.prompt_texts[2]
    assert request.max_tokens == 7  # max_completion_tokens wins, as in OpenAI's API
    assert request.stream and not request.wants_usage


def test_completions_prompt_forms() -> None:
    assert parse_inference_body(COMPLETIONS_PATH, b'{"prompt": "abc"}').prompt_texts == ("abc",)
    ids = parse_inference_body(COMPLETIONS_PATH, b'{"prompt": [1, 2, 3]}')
    assert ids.prompt_token_ids == 3 and ids.prompt_texts == ()
    many = parse_inference_body(COMPLETIONS_PATH, b'{"prompt": ["a", "b"], "max_tokens": 5}')
    assert many.prompt_texts == ("a", "b") and many.max_tokens == 5
    with pytest.raises(InvalidRequest):
        parse_inference_body(COMPLETIONS_PATH, b'{"prompt": ["a", 1]}')


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
        parse_inference_body(CHAT_PATH, body)
    assert info.value.reason == reason
    assert fragment in info.value.message
    assert info.value.status == 400


def test_huge_max_tokens_parses_and_is_left_to_the_context_check() -> None:
    request = parse_inference_body(CHAT_PATH, chat(max_tokens=10**30))
    assert request.max_tokens == 10**30


def test_usage_is_requested_for_streams_by_splicing() -> None:
    body = chat(stream=True)
    request = parse_inference_body(CHAT_PATH, body)
    new = with_usage_requested(body, request)
    assert new is not None
    decoded = json.loads(new)
    assert decoded["stream_options"] == {"include_usage": True}
    assert decoded["messages"] == json.loads(body)["messages"]


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}, {"other": 1}])
def test_existing_stream_options_are_merged_not_duplicated(options: object) -> None:
    body = chat(stream=True, stream_options=options)
    new = with_usage_requested(body, parse_inference_body(CHAT_PATH, body))
    assert new is not None
    assert new.count(b'"stream_options"') == 1
    merged = json.loads(new)["stream_options"]
    assert merged["include_usage"] is True
    if isinstance(options, dict):
        assert all(merged[k] == v for k, v in options.items() if k != "include_usage")


def test_no_mutation_when_not_needed() -> None:
    for body in (chat(), chat(stream=True, stream_options={"include_usage": True})):
        assert with_usage_requested(body, parse_inference_body(CHAT_PATH, body)) is None
