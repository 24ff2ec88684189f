"""A span per decision in the client's trace (telemetry.tracing); JSON logs:
tests/extproc/service/test_log_records.py.

Spans go over real OTLP/gRPC to a real receiver (tooling.stack.otlp_receiver, opentelemetry-
proto's TraceService on a grpcio server on 127.0.0.1:0). The sidecar runs in this process
(real gRPC, as in tests/extproc/runtime/test_sidecar.py) or as `slogate serve`; behind
Envoy (the stack): tests/e2e/extproc/service/test_tracing.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc.runtime.sidecar import Sidecar
from policy.loader import parse_policy
from tests.support.http import CHAT, chat_body
from tests.support.in_process import in_process
from tests.support.stack import EXAMPLE_POLICY, ROOT, example_policy, write_policy
from tests.support.tracing import CLIENT_SPAN, CLIENT_TRACE, TRACEPARENT
from tooling.benchmarks.driver import SidecarDriver, _headers_message
from tooling.stack.otlp_receiver import ReceivedSpan, TraceReceiver


def traced_policy(tmp_path: Path, endpoint: str | None, **tracing: Any) -> Path:
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False  # no pools run for the in-process sidecar
    if endpoint is not None:
        raw["telemetry"] = {"tracing": {"otlp_endpoint": endpoint, **tracing}}
    return write_policy(tmp_path / "policy.yaml", raw)


@pytest.fixture
async def traced(
    tmp_path: Path, receiver: TraceReceiver
) -> AsyncIterator[tuple[Sidecar, SidecarDriver]]:
    path = traced_policy(tmp_path, receiver.endpoint, service_name="slogate-test")
    async with in_process(path) as (sidecar, driver, _):
        yield sidecar, driver


async def arrived(receiver: TraceReceiver, count: int) -> list[ReceivedSpan]:
    """The receiver's spans once `count` came, waited for off the loop: the sidecar in this
    process runs on it (a client's reset, the exporter's callbacks)."""
    return await asyncio.to_thread(receiver.wait_for, count)


def by_request(spans: list[ReceivedSpan], request_id: str) -> ReceivedSpan:
    found = [s for s in spans if s.attributes.get("slogate.request_id") == request_id]
    assert len(found) == 1, [s.attributes for s in spans]
    return found[0]


async def test_a_decision_is_a_span_in_the_clients_trace_and_its_id_goes_upstream(
    traced: tuple[Sidecar, SidecarDriver], receiver: TraceReceiver
) -> None:
    _sidecar, driver = traced
    routed = await driver.decide(
        "sk-demo-standard",
        chat_body("hello there", max_tokens=64),
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=7", "x-request-id": "r-1"},
    )
    assert routed.status == 200
    span = by_request(await arrived(receiver, 1), "r-1")
    assert span.name == "slogate.decision" and span.service == "slogate-test"
    assert (span.trace_id, span.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert span.start_ns < span.end_ns
    attributes = span.attributes
    assert attributes["slogate.outcome"] == "routed"
    assert attributes["slogate.tenant"] == "demo-standard"
    assert attributes["slogate.tier"] == "standard"
    assert attributes["slogate.pool"] == "default"
    assert attributes["slogate.bucket"] == routed.headers["x-slogate-bucket"]
    assert 0 < attributes["slogate.prompt_tokens"] < 64
    assert attributes["slogate.max_tokens"] == 64
    assert "slogate.reason" not in attributes
    # The engine's spans nest under the decision: its traceparent names the sidecar's span.
    assert routed.headers["traceparent"] == f"00-{CLIENT_TRACE}-{span.span_id}-01"
    assert routed.headers["tracestate"] == "vendor=7"


async def test_refusals_are_spans_with_their_outcome_and_reason(
    traced: tuple[Sidecar, SidecarDriver], receiver: TraceReceiver
) -> None:
    _sidecar, driver = traced
    unknown = await driver.decide(
        "sk-nobody", chat_body(), headers={"traceparent": TRACEPARENT, "x-request-id": "r-401"}
    )
    assert unknown.status == 401
    # sk-demo-small may reserve 2000 tokens a minute: the second 1500 is refused.
    small = chat_body("hi", max_tokens=1500)
    assert (await driver.decide("sk-demo-small", small)).status == 200
    limited = await driver.decide("sk-demo-small", small, headers={"x-request-id": "r-429"})
    assert limited.status == 429
    assert "traceparent" not in unknown.headers | limited.headers  # nothing goes upstream
    spans = await arrived(receiver, 3)
    refused = by_request(spans, "r-401")
    assert refused.trace_id == CLIENT_TRACE and refused.parent_span_id == CLIENT_SPAN
    assert refused.attributes["slogate.outcome"] == "refused"
    assert refused.attributes["slogate.reason"] == "unknown_api_key"
    assert refused.attributes["http.response.status_code"] == 401
    assert "slogate.tenant" not in refused.attributes  # no caller was known
    over = by_request(spans, "r-429")
    assert over.parent_span_id == ""  # no client trace: a trace of its own
    assert over.attributes["slogate.outcome"] == "refused"
    assert over.attributes["slogate.reason"] == limited.headers["x-slogate-reason"]
    # What was decided before the refusal is on the span: who asked, where it would go.
    assert over.attributes["slogate.tenant"] == "demo-small"
    assert over.attributes["slogate.pool"] == "default"
    assert over.attributes["slogate.max_tokens"] == 1500


async def test_a_sample_ratio_of_zero_keeps_only_sampled_client_traces(
    tmp_path: Path, receiver: TraceReceiver
) -> None:
    path = traced_policy(tmp_path, receiver.endpoint, sample_ratio=0.0)
    async with in_process(path) as (_, driver, _):  # its stop sends whatever is batched
        alone = await driver.decide("sk-demo-standard", chat_body(), headers={"x-request-id": "a"})
        sampled = await driver.decide(
            "sk-demo-standard",
            chat_body(),
            headers={"x-request-id": "b", "traceparent": TRACEPARENT},
        )
    assert "traceparent" not in alone.headers  # not sampled: nothing set upstream
    assert sampled.headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
    assert [s.attributes["slogate.request_id"] for s in receiver.spans()] == ["b"]


_IMPORTS_SCRIPT = """
import asyncio, json, sys
from pathlib import Path

class NotInstalled:  # as if the tracing extra were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"No module named {name!r}", name=name)

if sys.argv[3] == "without":
    sys.meta_path.insert(0, NotInstalled())
from extproc.runtime.sidecar import Sidecar
from tooling.benchmarks.driver import SidecarDriver

async def main():
    sidecar = Sidecar(Path(sys.argv[1]), grpc_port=0, metrics_port=None, admin_address=None,
                      exact_tokenizer=False)
    address = await sidecar.start()
    driver = SidecarDriver(f"127.0.0.1:{address.grpc_port}")
    body = {"model": "deepseek-v4", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8}
    reply = await driver.decide("sk-demo-standard", body, headers={"traceparent": sys.argv[2]})
    await driver.close()
    await sidecar.stop(grace_s=0.5)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"status": reply.status, "opentelemetry": loaded,
                      "traceparent": reply.headers.get("traceparent")}))

asyncio.run(main())
"""


# What slogate's tracer loads. (redis-py loads opentelemetry's metrics SDK by itself when
# it is installed; without it installed, redis-py and slogate both run.)
TRACER_MODULES = {
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.trace.propagation.tracecontext",
}


def sidecar_imports(policy: Path, opentelemetry: str = "installed") -> dict[str, Any]:
    """A fresh interpreter decides one request; which opentelemetry modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_SCRIPT, str(policy), TRACEPARENT, opentelemetry],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_without_a_tracing_section_opentelemetry_is_never_imported(
    tmp_path: Path, receiver: TraceReceiver
) -> None:
    off = sidecar_imports(traced_policy(tmp_path, None))
    assert off["status"] == 200
    assert TRACER_MODULES.isdisjoint(off["opentelemetry"]), off["opentelemetry"]
    assert off["traceparent"] is None  # the client's goes upstream untouched
    # The same script with the section does load them (the check above can fail).
    on = sidecar_imports(traced_policy(tmp_path, receiver.endpoint))
    assert on["status"] == 200 and set(on["opentelemetry"]) >= TRACER_MODULES
    assert on["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
    # Without OpenTelemetry installed at all, the sidecar decides as before.
    without = sidecar_imports(traced_policy(tmp_path, None), opentelemetry="without")
    assert without["status"] == 200 and without["opentelemetry"] == []


def test_the_example_policys_tracing_block_loads() -> None:
    text = EXAMPLE_POLICY.read_text()
    block = text[text.index("# telemetry:") :].split("\n\n")[0]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    raw = example_policy()
    raw["telemetry"] = yaml.safe_load(uncommented)["telemetry"]
    tracing = parse_policy(raw).telemetry.tracing
    assert tracing is not None and tracing.otlp_endpoint == "otel-collector:4317"
    assert (tracing.service_name, tracing.sample_ratio) == ("slogate", 1.0)


async def waiting(channel: grpc.aio.Channel, request_id: str) -> Any:
    """A sheddable request's stream, once the sidecar said it waits (a timeout override)."""
    body = json.dumps(chat_body()).encode()
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    await call.write(_headers_message(CHAT, "sk-demo-batch", body, {"x-request-id": request_id}))
    await call.read()
    await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    override = await call.read()
    assert override.HasField("override_message_timeout")
    return call


async def test_a_wait_ends_as_a_shed_span_or_an_abandoned_one(
    tmp_path: Path, receiver: TraceReceiver
) -> None:
    """The pool's one batch slot held: the next sheddable request waits in the room. One
    waits out its 1 s and is shed (503 queue_timeout); one is left by its client while it
    waits (Envoy resets the stream)."""
    raw = example_policy()
    raw["breaker"]["scrape_metrics"] = False
    raw["breaker"]["kv_shares"] = {"critical": 1.0, "standard": 1.0, "sheddable": 1.0}
    raw["pools"]["default"]["max_num_seqs"] = 1
    raw["waiting_room"] = {"max_wait_s": {"sheddable": 1.0}}
    raw["telemetry"] = {"tracing": {"otlp_endpoint": receiver.endpoint}}
    async with in_process(write_policy(tmp_path / "policy.yaml", raw)) as (_, driver, address):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{address.grpc_port}")
        try:
            holder = await driver.decide(
                "sk-demo-batch", chat_body(), headers={"x-request-id": "h"}
            )
            assert holder.status == 200  # holds the slot from now on
            shed_call = await waiting(channel, "s")
            shed = (await shed_call.read()).immediate_response  # after its 1 s in the room
            await shed_call.done_writing()
            assert shed.status.code == 503
            call = await waiting(channel, "gone")
            call.cancel()  # the client left
            spans = await arrived(receiver, 3)
        finally:
            await channel.close()
    waited = by_request(spans, "s").attributes
    assert waited["slogate.outcome"] == "shed"
    assert waited["slogate.reason"] == "queue_timeout"
    assert waited["http.response.status_code"] == 503
    assert waited["slogate.tenant"] == "demo-batch" and waited["slogate.tier"] == "sheddable"
    left = by_request(spans, "gone")
    assert left.attributes["slogate.outcome"] == "abandoned"
    assert left.attributes["slogate.pool"] == "default"


def test_serve_says_what_to_install_when_tracing_is_set_without_opentelemetry(
    tmp_path: Path,
) -> None:
    policy = traced_policy(tmp_path, "127.0.0.1:4317")
    script = _IMPORTS_SCRIPT.split("async def main")[0] + (
        "from tooling.cli.main import main\n"
        "sys.exit(main(['serve', '--policy', sys.argv[1], '--grpc-port', '0', "
        "'--metrics-port', '0', '--admin-address', 'none', '--no-exact-tokenizer']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(policy), TRACEPARENT, "without"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'slogate[tracing]'" in done.stderr
    assert "Traceback" not in done.stderr
