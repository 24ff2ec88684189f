"""The simulated pool's Responses API and Anthropic Messages API held to a real vLLM.

As tests/e2e/test_sim_matches_vllm.py does for chat and completions: the same request goes to
vLLM (the stack's default pool) and to a simulated pool, and the JSON answers and each kind
of stream event are compared by their keys, in order (vLLM's null fields included), with
the events' names in the order they come. And what vLLM's Messages usage means for
slogate: `input_tokens` leaves out the cache vLLM read and wrote, and the usage tap still
charges the whole prompt.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from tests.support.http import metric, post, scrape
from tests.support.stack import settled, wait_for
from tests.support.vllm import words
from tooling.stack.local import LocalStack

pytestmark = pytest.mark.vllm
MESSAGES, RESPONSES = "/v1/messages", "/v1/responses"
CASES = [
    (
        MESSAGES,
        {
            "model": "deepseek-v4",
            "max_tokens": 4,
            "system": "be brief",
            "messages": [{"role": "user", "content": "tell me"}],
            "ignore_eos": True,
        },
    ),
    (
        RESPONSES,
        {
            "model": "deepseek-v4",
            "input": "tell me",
            "instructions": "be brief",
            "max_output_tokens": 4,
            "temperature": 0.5,
            "ignore_eos": True,
        },
    ),
]
IDS = ["messages", "responses"]


def shape(value: Any) -> Any:
    """Keys all the way down, in order; lists by their first item; scalars as None."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None


def events(port: int, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) in arrival order, `event:` lines checked against the data."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {"content-type": "application/json"}
        conn.request("POST", path, body=json.dumps({**body, "stream": True}), headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type", "").startswith("text/event-stream")
        raw = response.read().decode()
    finally:
        conn.close()
    found = []
    for block in filter(None, raw.split("\n\n")):
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name, block
        found.append((name, data))
    return found


@pytest.mark.parametrize(("path", "body"), CASES, ids=IDS)
def test_answers_have_vllm_shapes(vllm_stack: LocalStack, path: str, body: dict[str, Any]) -> None:
    real = post(vllm_stack.pool_url("default"), path, body, key=None)
    simulated = post(vllm_stack.pool_url("fallback"), path, body, key=None)
    assert real.status == simulated.status == 200, (real.body[:300], simulated.body[:300])
    assert shape(simulated.json()) == shape(real.json())


@pytest.mark.parametrize(("path", "body"), CASES, ids=IDS)
def test_streams_have_vllm_events(vllm_stack: LocalStack, path: str, body: dict[str, Any]) -> None:
    real = events(vllm_stack.pool_ports["default"], path, body)
    simulated = events(vllm_stack.pool_ports["fallback"], path, body)

    def kinds(stream: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
        # A token may decode to "" in vLLM (and send no delta): runs of deltas count once.
        out: list[tuple[str, Any]] = []
        for name, data in stream:
            if not (out and out[-1][0] == name and name.endswith("delta")):
                out.append((name, shape(data)))
        return out

    assert [name for name, _ in kinds(simulated)] == [name for name, _ in kinds(real)]
    for (name, got), (_, expected) in zip(kinds(simulated), kinds(real), strict=True):
        assert got == expected, f"{name}: {got} != vLLM's {expected}"
    if path == RESPONSES:
        for stream in (real, simulated):
            assert [data["sequence_number"] for _, data in stream] == list(range(len(stream)))


def test_a_messages_answer_settles_its_whole_prompt(vllm_stack: LocalStack) -> None:
    stack = vllm_stack
    before, engine_before = settled(stack), scrape(f"{stack.pool_url('default')}/metrics")
    body = {
        "model": "deepseek-v4",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": words(300, 11)}],
    }
    reply = post(stack.url, MESSAGES, body)
    assert reply.status == 200, reply.body
    assert reply.headers["x-slogate-pool"] == "default"
    usage = reply.json()["usage"]
    # vLLM wrote the prompt's whole blocks to its cache and counts them apart.
    assert usage["cache_creation_input_tokens"] > 0
    whole = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )

    def charged() -> float:
        now = scrape(stack.metrics_url)
        return metric(now, "slogate_tokens_total", pool="default", kind="prompt") - metric(
            before, "slogate_tokens_total", pool="default", kind="prompt"
        )

    assert wait_for(lambda: charged() == whole), (charged(), usage)
    engine_after = scrape(f"{stack.pool_url('default')}/metrics")
    engine = metric(engine_after, "vllm:prompt_tokens_total") - metric(
        engine_before, "vllm:prompt_tokens_total"
    )
    assert engine == whole
