"""The sidecar's composition root in this process, spoken to over real gRPC as Envoy does.

No Envoy and no other process: `Sidecar` binds port 0, the driver opens one ext_proc stream
per request and sends the access-log entries back. What the stack tests check through
Envoy, these check one layer down, fast enough for the quick suite.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.request.contract import POOL_HEADER, REASON_HEADER
from extproc.runtime.sidecar import Sidecar
from extproc.service.traffic_read import read_traffic
from tests.support.in_process import in_process
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import SidecarDriver, _headers_message


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, SidecarDriver]]:
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False  # no pools run here
    path = tmp_path / "policy.yaml"
    write_policy(path, policy)
    async with in_process(path) as (sidecar, driver, address):
        assert address.metrics_port is None and address.admin is None
        yield sidecar, driver


def chat(content: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": "deepseek-v4",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }


async def test_routes_by_context_and_refuses_with_openai_errors(
    running: tuple[Sidecar, SidecarDriver],
) -> None:
    _sidecar, driver = running
    short = await driver.decide("sk-demo-standard", chat("hello there", 64))
    assert short.status == 200 and short.tracking_id
    assert short.headers[POOL_HEADER] == "default"
    # prompt + max_tokens past 32k goes to the long pool, with a few prompt tokens only.
    long = await driver.decide("sk-demo-standard", chat("hello there", 40_000))
    assert long.status == 200 and long.headers[POOL_HEADER] == "long"

    unknown = await driver.decide("sk-nobody", chat("hello", 16))
    assert unknown.status == 401
    assert json.loads(unknown.body)["error"]["code"] == "invalid_api_key"
    too_long = await driver.decide("sk-demo-standard", chat("hello", 200_000))
    assert too_long.status == 400
    assert json.loads(too_long.body)["error"]["code"] == "context_length_exceeded"
    assert too_long.headers[REASON_HEADER]


async def test_access_log_settles_what_the_request_reserved(
    running: tuple[Sidecar, SidecarDriver],
) -> None:
    sidecar, driver = running
    # sk-demo-small may spend 2000 tokens a minute: one 1500-token reservation at a time.
    first = await driver.decide("sk-demo-small", chat("hi", 1500))
    assert first.status == 200 and first.tracking_id
    refused = await driver.decide("sk-demo-small", chat("hi", 1500))
    assert refused.status == 429
    assert json.loads(refused.body)["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert len(sidecar.path.decider.inflight) == 1  # the refusal left nothing behind

    # The first request used 20 tokens: settling refunds the rest of its reservation.
    await driver.report([first.outcome(200, 8, 12)])
    assert len(sidecar.path.decider.inflight) == 0
    again = await driver.decide("sk-demo-small", chat("hi", 1500))
    assert again.status == 200, again.body


async def test_a_wait_that_times_out_on_a_stalled_loop_is_answered_before_envoys_timer(
    tmp_path: Path,
) -> None:
    """Envoy restarts its timer for a waiting request's reply when the override arrives
    (Envoy 1.40's ext_proc). A sidecar that gets no CPU past the room's deadline (the loop
    blocked here; a loaded machine starved it 2-5 s) must still send the room's 503 before
    that timer: with an override of only the wait + the message timeout, Envoy answered
    504 first."""
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False
    raw["breaker"]["kv_shares"] = {"critical": 1.0, "standard": 1.0, "sheddable": 1.0}
    raw["pools"]["default"]["max_num_seqs"] = 1
    raw["waiting_room"] = {"max_wait_s": {"sheddable": 1.0}}
    path = write_policy(tmp_path / "policy.yaml", raw)
    async with in_process(path) as (_, driver, address):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{address.grpc_port}")
        try:
            holder = await driver.decide("sk-demo-batch", chat("hello", 16))
            assert holder.status == 200  # the pool's one batch slot, held from now on
            body = json.dumps(chat("and me", 16)).encode()
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(_headers_message("/v1/chat/completions", "sk-demo-batch", body))
            await call.read()
            await call.write(
                pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
            )
            override = await call.read()
            arrived = time.monotonic()  # Envoy's timer runs from here
            assert override.HasField("override_message_timeout")
            envoy_timer_s = override.override_message_timeout.ToMilliseconds() / 1000
            # The loop stalls (on purpose) past the wait + the message timeout.
            time.sleep(1.0 + 1.0 + 1.0)  # noqa: ASYNC251
            reply = await call.read()
            answered_s = time.monotonic() - arrived
            await call.done_writing()
        finally:
            await channel.close()
    immediate = reply.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    assert immediate.status.code == 503 and headers[REASON_HEADER] == "queue_timeout"
    assert answered_s < envoy_timer_s - 5.0, (answered_s, envoy_timer_s)


async def test_the_decision_log_and_traffic_record_observe_decisions_and_answers(
    tmp_path: Path,
) -> None:
    """One observer list (extproc.service.observers): each observer sees a request's
    decision from the ext_proc side and its answer from the access-log side."""
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False
    raw["decision_log"] = {"dir": str(tmp_path / "decisions"), "sample_rate": 1.0}
    raw["traffic_record"] = {"dir": str(tmp_path / "traffic"), "sample_rate": 1.0}
    path = write_policy(tmp_path / "policy.yaml", raw)
    async with in_process(path) as (sidecar, driver, _):
        observers = [sidecar.observers.decision_log, sidecar.observers.traffic]
        assert sidecar.observers.watching() == observers  # tracing off: no tracer among them
        assert all(o in sidecar.path.recorder.sinks for o in observers)
        routed = await driver.decide("sk-demo-standard", chat("hello", 16))
        refused = await driver.decide("sk-nobody", chat("hello", 16))
        assert (routed.status, refused.status) == (200, 401)
        await driver.report([routed.outcome(200, 8, 12)])
    (log,) = (tmp_path / "decisions").glob("decisions-*.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(line["decision"] for line in lines) == ["refused", "routed"]
    entries = read_traffic([tmp_path / "traffic"]).entries
    assert sorted(e.verdict for e in entries) == ["admitted", "refused:unknown_api_key"]
