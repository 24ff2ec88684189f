"""Usage read from a response body as it passes through in chunks (streaming mode)."""

from __future__ import annotations

import json

from extproc.request.response_usage import TAIL_BYTES, ResponseUsage


def fed(*chunks: bytes) -> ResponseUsage:
    usage = ResponseUsage()
    for chunk in chunks:
        usage.feed(chunk)
    return usage


def test_a_json_answers_usage() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": "hi " * 30_000}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7},
        }
    ).encode()
    usage = fed(*(body[i : i + 1000] for i in range(0, len(body), 1000)))
    assert (usage.prompt_tokens, usage.completion_tokens, usage.stream_events) == (12, 7, None)
    assert len(body) > TAIL_BYTES  # only its tail was kept


def test_a_streams_usage_event_split_across_chunks() -> None:
    events = [
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n',
        b'data: {"choices":[{"delta":{"content":"b"}}],"usage":null}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":3}}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    usage = fed(*(stream[i : i + 7] for i in range(0, len(stream), 7)))  # 'data:' split too
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 2)
    assert usage.cached_tokens == 3 and usage.stream_events == 3


def test_anthropics_usage_adds_its_prompt_cache() -> None:
    usage = fed(b'{"usage":{"input_tokens":4,"cache_read_input_tokens":10,"output_tokens":9}}')
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (14, 9, 10)


def test_no_usage_is_none() -> None:
    usage = fed(b'{"error": {"message": "no"}}')
    assert usage.prompt_tokens is None and usage.completion_tokens is None


def test_a_count_longer_than_any_is_not_believed_and_raises_nothing() -> None:
    """An engine's body with a 5,000-digit count: int() refuses more than 4,300 digits
    (ValueError on the response path); and two billion or more is no request's usage."""
    huge = b'{"usage": {"prompt_tokens": ' + b"9" * 5000 + b', "completion_tokens": 2147483648}}'
    usage = fed(huge)
    assert (usage.prompt_tokens, usage.completion_tokens) == (None, None)
    assert fed(b'{"usage": {"prompt_tokens": 2147483647}}').prompt_tokens == 2**31 - 1
