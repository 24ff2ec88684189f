"""The stack driven by the official `openai` Python client, as its users drive any server.

Against the simulated stack and against the one with a real vLLM behind the default pool:
answers and usage, streams with and without usage, and slogate's refusals as the client's
own exceptions (`RateLimitError` with `retry-after`, `BadRequestError`,
`AuthenticationError`), with no retries so each refusal is seen as sent.
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.support.vllm import words
from tooling.stack.local import LocalStack


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def served(request: pytest.FixtureRequest) -> LocalStack:
    stack: LocalStack = request.getfixturevalue("stack" if request.param == "sim" else "vllm_stack")
    return stack


def client(stack: LocalStack, key: str = "sk-demo-standard") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_answers_and_usage_as_the_client_sees_them(served: LocalStack) -> None:
    answer = client(served).chat.completions.create(
        model="deepseek-v4",
        messages=[{"role": "user", "content": words(40, 1)}],
        max_tokens=8,
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens <= 8
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    raw = client(served).chat.completions.with_raw_response.create(
        model="deepseek-v4", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert raw.headers["x-slogate-pool"] == "default"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) >= 0


def test_streams_with_and_without_usage(served: LocalStack) -> None:
    started = time.monotonic()
    first_s = None
    chunks = []
    for chunk in client(served).chat.completions.create(
        model="deepseek-v4",
        messages=[{"role": "user", "content": words(40, 2)}],
        max_tokens=16,
        stream=True,
    ):
        if first_s is None and chunk.choices and chunk.choices[0].delta.content:
            first_s = time.monotonic() - started
        chunks.append(chunk)
    total_s = time.monotonic() - started
    assert first_s is not None and first_s <= total_s
    # slogate asked the engine for usage; a client that did not ask never sees it.
    assert all(c.usage is None and c.choices for c in chunks)

    asked = list(
        client(served).chat.completions.create(
            model="deepseek-v4",
            messages=[{"role": "user", "content": "again"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [c for c in asked if c.usage is not None]
    assert len(usage) == 1 and usage[0].choices == [] and usage[0].usage is not None
    assert 0 < usage[0].usage.completion_tokens <= 8


def test_refusals_are_the_clients_own_exceptions(served: LocalStack) -> None:
    small = client(served, "sk-demo-small")  # 5 requests a minute
    with pytest.raises(openai.RateLimitError) as limited:
        for _ in range(12):
            small.chat.completions.create(
                model="deepseek-v4", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    assert limited.value.status_code == 429
    assert float(limited.value.response.headers["retry-after"]) > 0
    assert limited.value.response.headers["x-slogate-reason"]

    with pytest.raises(openai.BadRequestError) as bad:
        client(served).chat.completions.create(
            model="deepseek-v4", messages=[{"role": "user", "content": "hi"}], max_tokens=10**9
        )
    assert bad.value.code == "context_length_exceeded"

    with pytest.raises(openai.AuthenticationError) as denied:
        client(served, "sk-not-a-key").chat.completions.create(
            model="deepseek-v4", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert denied.value.status_code == 401
