"""Warm before ready (issue 31), in process: the warm-up goes through the whole chain and
leaves nothing behind; one that fails or overruns is logged and readiness comes anyway. That
no client pays the warm-up, through real Envoy and a real `slogate serve`, is
tests/e2e/test_warm_up.py.
"""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import generate_latest

from extproc.request.tokens.native import exact_counter
from extproc.runtime.sidecar import Sidecar
from extproc.runtime.warm_up import warm_up
from policy.schema import Policy
from tests.support.http import CHAT, chat_body
from tests.support.stack import EXAMPLE_POLICY

# A client's prompt of ~100 tokens, for the control decision.
PROMPT = " ".join(["the gateway counts every prompt before it routes it"] * 10)


def _state(sidecar: Sidecar) -> tuple[object, ...]:
    """What a client decision leaves: metrics, in-flight entries, KV holds and waiters,
    engine holds, counted messages."""
    return (
        # Every series but the loop's lag, which is the time since its loop last ticked
        # (no loop runs before start), and the process's own (its CPU, memory, heap).
        [
            line
            for line in generate_latest(sidecar.metrics.registry).decode().splitlines()
            if not line.startswith(
                ("slogate_event_loop_lag_seconds ", "process_", "slogate_gc_frozen_objects ")
            )
        ],
        len(sidecar.path.decider.inflight),
        tuple(dict(part) for part in sidecar.path.admission.kv.book.held_by_pool()),
        dict(sidecar.path.admission.kv.dispatcher.room.counts()),
        sidecar.signals.engine_watch.fleet.holds,
        sidecar.path.counter.cache_size,
    )


async def test_the_warm_up_leaves_nothing_behind(caplog: pytest.LogCaptureFixture) -> None:
    """A real sidecar's parts and tokenizer: its decision is admitted through the chain,
    and nothing of it shows in the sidecar's metrics or state afterwards."""
    sidecar = Sidecar(EXAMPLE_POLICY, grpc_port=0, metrics_port=None, admin_address=None)
    try:
        bpe = exact_counter(sidecar.policy().counting.engine)
        before = _state(sidecar)
        with caplog.at_level(logging.INFO, "slogate.warm_up"):
            took = await warm_up(
                sidecar.policy,
                bpe,
                sidecar._exact_executor,
                sidecar.signals.board,
                sidecar.signals.engine_watch.fleet.live_pool,
            )
        assert took is not None and set(took) == {"short", "long", "non_ascii", "decision"}
        assert "(admitted)" in caplog.text  # it went through the whole chain
        assert _state(sidecar) == before
        # The control: a client's decision through the same parts does show.
        flow = sidecar.path.decider.new_flow()
        await flow.on_request_headers(
            {":method": "POST", ":path": CHAT, "authorization": "Bearer sk-demo-standard"}, False
        )
        await flow.on_request_body(json.dumps(chat_body(PROMPT)).encode())
        assert _state(sidecar) != before
    finally:
        await sidecar.stop(grace_s=0.1)


async def test_a_warm_up_that_fails_or_overruns_is_logged_and_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Readiness comes anyway: no exception, no stall past the bound."""
    sidecar = Sidecar(EXAMPLE_POLICY, grpc_port=0, metrics_port=None, admin_address=None)
    parts = (
        sidecar._exact_executor,
        sidecar.signals.board,
        sidecar.signals.engine_watch.fleet.live_pool,
    )
    try:
        with caplog.at_level(logging.INFO, "slogate.warm_up"):
            bpe = exact_counter(sidecar.policy().counting.engine)
            assert await warm_up(sidecar.policy, bpe, *parts, timeout_s=0.0) is None
            assert "ran past" in caplog.text

            def broken() -> Policy:
                raise RuntimeError("no policy")

            assert await warm_up(broken, bpe, *parts) is None
            assert "warm-up failed" in caplog.text
    finally:
        await sidecar.stop(grace_s=0.1)
