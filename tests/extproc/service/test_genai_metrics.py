"""OpenTelemetry's GenAI metric names beside slogate's own, from the same access-log entries.

The sidecar runs in this process over real gRPC (as in tests/extproc/runtime/test_sidecar.py); the
driver sends the access-log entries Envoy would, and the sidecar's registry is read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from extproc.runtime.sidecar import Sidecar
from tests.support.http import chat_body
from tests.support.in_process import in_process
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import SidecarDriver

CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "deepseek-v4"}


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, SidecarDriver]]:
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False  # no pools run here
    async with in_process(write_policy(tmp_path / "policy.yaml", raw)) as (sidecar, driver, _):
        yield sidecar, driver


async def test_an_answered_chat_is_observed_under_the_conventions_names(
    running: tuple[Sidecar, SidecarDriver],
) -> None:
    sidecar, driver = running
    answered = await driver.decide("sk-demo-standard", chat_body(max_tokens=64))
    failed = await driver.decide("sk-demo-standard", chat_body(max_tokens=64))
    assert answered.tracking_id and failed.tracking_id
    # 8 prompt and 21 completion tokens; 20 ms to the first token of 100 ms (the driver's).
    await driver.report([answered.outcome(200, 8, 21), failed.outcome(500, None, None)])

    def value(name: str, **labels: str) -> float | None:
        return sidecar.metrics.registry.get_sample_value(name, {**CHAT, **labels})

    assert value("gen_ai_server_request_duration_seconds_count") == 1  # not the 500
    assert value("gen_ai_server_request_duration_seconds_sum") == pytest.approx(0.1)
    assert value("gen_ai_server_time_to_first_token_seconds_sum") == pytest.approx(0.02)
    assert value("gen_ai_server_time_to_first_token_seconds_bucket", le="0.02") == 1
    assert value("gen_ai_server_time_to_first_token_seconds_bucket", le="0.01") == 0
    # (100 - 20) ms over the 20 tokens after the first.
    assert value("gen_ai_server_time_per_output_token_seconds_sum") == pytest.approx(0.004)
    assert value("gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 8
    assert value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 21
    # slogate's own series saw the same answer.
    assert (
        sidecar.metrics.registry.get_sample_value(
            "slogate_upstream_ttft_seconds_count",
            {"pool": "default", "bucket": "0-4k", "tier": "standard"},
        )
        == 1
    )


async def test_embeddings_count_input_tokens_only(running: tuple[Sidecar, SidecarDriver]) -> None:
    sidecar, driver = running
    body = {"model": "deepseek-v4", "input": "hello there"}
    embedded = await driver.decide("sk-demo-standard", body, path="/v1/embeddings")
    assert embedded.status == 200 and embedded.tracking_id
    await driver.report([embedded.outcome(200, 3, None)])
    labels = {"gen_ai_operation_name": "embeddings", "gen_ai_request_model": "deepseek-v4"}

    def value(name: str, **more: str) -> float | None:
        return sidecar.metrics.registry.get_sample_value(name, {**labels, **more})

    assert value("gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 3
    assert value("gen_ai_client_token_usage_count", gen_ai_token_type="output") is None
    assert value("gen_ai_server_time_per_output_token_seconds_count") is None
    assert value("gen_ai_server_request_duration_seconds_count") == 1
