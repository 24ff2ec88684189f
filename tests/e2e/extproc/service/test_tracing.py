"""A span per decision through Envoy (the stack): the engine gets the decision's span as its
parent, in both ext_proc message modes, and the sidecar's JSON log names the same requests.
The rest of tracing: tests/extproc/service/test_tracing.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policy._data_path import ExtProcMessages
from tests.support.http import CHAT, chat_body, post
from tests.support.messages import MODE_IDS, MODES, with_messages
from tests.support.stack import example_policy, start_stack, write_policy
from tests.support.tracing import CLIENT_SPAN, CLIENT_TRACE, TRACEPARENT
from tooling.stack.otlp_receiver import TraceReceiver


@pytest.mark.parametrize("messages", MODES, ids=MODE_IDS)
def test_through_envoy_the_engine_gets_the_decisions_span_as_its_parent(
    tmp_path: Path, receiver: TraceReceiver, messages: ExtProcMessages
) -> None:
    """In both ext_proc message modes: with one, the client's trace context reaches the
    sidecar as metadata and the span's goes upstream through the pool route."""
    raw = with_messages(example_policy(), messages)
    raw["telemetry"] = {"tracing": {"otlp_endpoint": receiver.endpoint}}
    stack = start_stack(
        tmp_path,
        write_policy(tmp_path / "policy.yaml", raw),
        sidecar_log_args=("--log-format", "json", "--log-level", "debug"),  # slogate up's
    )
    try:
        served = post(stack.url, CHAT, chat_body(), headers={"traceparent": TRACEPARENT})
        refused = post(stack.url, CHAT, chat_body(), key="sk-nobody")
        spans = receiver.wait_for(2)
    finally:
        stack.stop()
    assert served.status == 200 and refused.status == 401
    routed = next(s for s in spans if s.attributes["slogate.outcome"] == "routed")
    assert (routed.trace_id, routed.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert routed.attributes["slogate.tenant"] == "demo-standard"
    assert routed.attributes["slogate.request_id"]  # Envoy's x-request-id
    saw = json.loads(served.headers["x-sim-saw-headers"])
    assert saw["traceparent"] == f"00-{CLIENT_TRACE}-{routed.span_id}-01"
    assert saw["x-slogate-pool"] == routed.attributes["slogate.pool"]
    failed = next(s for s in spans if s.attributes["slogate.outcome"] == "refused")
    assert failed.attributes["slogate.reason"] == "unknown_api_key"
    assert failed.parent_span_id == "" and failed.attributes["slogate.request_id"]
    # The sidecar's JSON log names the same requests as the spans (Envoy's x-request-id).
    assert stack.sidecar is not None
    lines = [json.loads(line) for line in stack.sidecar.log_text().splitlines() if line.strip()]
    named = {line["message"].split(":")[0]: line.get("request_id") for line in lines}
    assert named["routed"] == routed.attributes["slogate.request_id"]
    assert named["refused"] == failed.attributes["slogate.request_id"]
