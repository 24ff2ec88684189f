"""The simulator decides every request exactly as the sidecar does.

One arrival sequence — tiers, keys and contexts mixed, a budget that runs out, a pool whose
KV cache fills, breaker drills to L2 and L3 and back — goes through two object graphs on
one virtual clock: the sidecar's own (`Sidecar`, fed request bodies and headers through
`RequestFlow`, settled by access-log entries through its `OutcomeRecorder`) and the
simulator's (`SimulatedSidecar`, fed texts). Each decision must match, one by one. Every
control-quality number the simulator publishes rests on this.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from admission.decision import RequestOutcome
from admission.errors import RequestRejected
from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel
from budget.quotas import TierMultipliers
from budget.store import InProcessStore
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.verdicts import Routed
from extproc.runtime.sidecar import Sidecar
from extproc.service.access_log import finish
from policy.domain import ApiKey
from policy.loader import load_policy
from policy.schema import Policy
from sim.fleet.sidecar import SimulatedSidecar, chat
from sim.server.tokenizer import shared_bpe
from tests.support.clock import VirtualClock
from tests.support.stack import example_policy, write_policy
from tooling.benchmarks.driver import access_log_entry

KEYS = ("sk-demo-critical", "sk-demo-standard", "sk-demo-batch", "sk-demo-small")
WORDS = (
    *("the", "cache", "of", "every", "long", "prompt", "stays", "warm"),
    *("while", "tokens", "stream", "out", "to", "callers"),
)


@dataclass(frozen=True, slots=True)
class Step:
    key: str
    text: str
    max_tokens: int
    stream: bool


def differential_policy(tmp_path: Path) -> Path:
    policy = example_policy()
    policy["breaker"]["scrape_metrics"] = False
    # Decisions made at once, one by one: the waiting room's order is tested on its own
    # (tests/admission/test_waiting_room.py, both drivers).
    policy["waiting_room"] = {"enabled": False}
    policy["breaker"]["controller_enabled"] = False
    # A long pool two or three long requests fill: KV refusals come early and often.
    policy["pools"]["long"]["kv_capacity_tokens"] = 400_000
    return write_policy(tmp_path / "policy.yaml", policy)


def arrivals(count: int, seed: int) -> list[Step]:
    rng = random.Random(seed)
    steps = []
    for _ in range(count):
        words = rng.choice((5, 40, 400, 3000))
        text = " ".join(rng.choice(WORDS) for _ in range(words)) + f" #{rng.randrange(10**6)}"
        max_tokens = rng.choice((64, 512, 1500, 6000, 40_000))
        steps.append(Step(rng.choice(KEYS), text, max_tokens, rng.random() < 0.5))
    return steps


def body(step: Step) -> bytes:
    return json.dumps(
        {
            "model": "deepseek-v4",
            "messages": [{"role": "user", "content": step.text}],
            "max_tokens": step.max_tokens,
            "stream": step.stream,
        }
    ).encode()


class SidecarSide:
    """The sidecar's composition root, not started: its request path and recorder."""

    def __init__(self, path: Path, clock: VirtualClock) -> None:
        self.sidecar = Sidecar(
            path, metrics_port=None, admin_address=None, clock=clock, rng=random.Random(7)
        )
        self.sidecar.path.counter.use(shared_bpe())

    async def decide(self, step: Step, request_id: str) -> Routed | RequestRejected:
        raw = body(step)
        flow = self.sidecar.path.decider.new_flow()
        headers = {
            ":method": "POST",
            ":path": "/v1/chat/completions",
            "authorization": f"Bearer {step.key}",
            "content-type": "application/json",
            "content-length": str(len(raw)),
            "x-request-id": request_id,
        }
        try:
            await flow.on_request_headers(headers, end_of_stream=False)
            return await flow.on_request_body(raw)
        except RequestRejected as refusal:
            return refusal

    async def finish(self, routed: Routed, completion: int) -> None:
        prompt = routed.decision.prompt_tokens
        entry = access_log_entry(
            routed.tracking_id, 200, prompt, completion, 1500, 200, routed.usage_proof
        )
        await finish(self.sidecar.path.recorder.record_entry(entry))


class SimulatorSide:
    def __init__(self, policy: Policy, clock: VirtualClock) -> None:
        self.policy = policy
        self.board = BreakerBoard(
            lambda: policy,
            ResponseWindows(clock=clock, slot_s=10.0, horizon_s=300.0),
            kv_cache_usage=lambda pool: None,
            gpu_memory_usage=lambda: None,
            clock=clock,
        )
        self.sidecar = SimulatedSidecar(
            policy,
            self.board,
            InProcessStore(clock),
            PromptCounter(shared_bpe(), policy.counting),
            clock,
            TierMultipliers().values,
            random.Random(7),
        )

    def decide(self, step: Step, request_id: str) -> Routed | RequestRejected:
        key = self.policy.key_for(step.key)
        assert isinstance(key, ApiKey)
        request = chat((step.text,), step.max_tokens, step.stream)
        return self.sidecar.attempt(key, request, request_id)

    def finish(self, routed: Routed, completion: int) -> None:
        decision = routed.decision
        self.sidecar.finish(
            RequestOutcome(
                decision,
                routed.tracking_id,
                200,
                decision.prompt_tokens,
                completion,
                0.2,
                1.5,
                "via_upstream",
            )
        )


def summary(decided: Routed | RequestRejected) -> tuple[object, ...]:
    if isinstance(decided, RequestRejected):
        return ("refused", decided.status, decided.reason)
    d = decided.decision
    return (
        "routed",
        d.pool,
        d.bucket.name,
        d.prompt_tokens,
        d.max_tokens,
        d.level,
        d.model_override,
        d.limits,
        d.stream,
    )


# Drills at these steps, on the default pool: (level, duration); L0 ends the drill.
DRILLS = {60: (BreakerLevel.L2, 600.0), 120: (BreakerLevel.L3, 600.0), 170: (BreakerLevel.L0, 1.0)}


@pytest.mark.parametrize("seed", [1, 2])
async def test_every_decision_matches_the_sidecars(tmp_path: Path, seed: int) -> None:
    path = differential_policy(tmp_path)
    clock = VirtualClock()
    sidecar = SidecarSide(path, clock)
    simulator = SimulatorSide(load_policy(path), clock)
    rng = random.Random(seed)
    running: list[tuple[Routed, Routed]] = []
    seen: list[tuple[object, ...]] = []
    for index, step in enumerate(arrivals(240, seed)):
        if index in DRILLS:
            level, duration_s = DRILLS[index]
            sidecar.sidecar.signals.board.drill("default", level, duration_s)
            simulator.board.drill("default", level, duration_s)
        request_id = f"r{index}"
        ours = await sidecar.decide(step, request_id)
        theirs = simulator.decide(step, request_id)
        assert summary(ours) == summary(theirs), f"step {index}: {step.key} {step.max_tokens}"
        seen.append(summary(ours))
        if isinstance(ours, Routed):
            assert isinstance(theirs, Routed)
            running.append((ours, theirs))
        # Requests end out of order, with less output than they were charged for.
        while running and rng.random() < 0.45:
            done_ours, done_theirs = running.pop(rng.randrange(len(running)))
            completion = rng.randint(1, max(1, done_ours.decision.max_tokens))
            await sidecar.finish(done_ours, completion)
            simulator.finish(done_theirs, completion)
        clock.advance(rng.choice((0.05, 0.5, 3.0)))

    # The sequence really went through each path it is meant to compare.
    reasons = {str(s[2]) for s in seen if s[0] == "refused"}
    routes = {(s[1], s[5], s[6]) for s in seen if s[0] == "routed"}
    assert any(r.startswith("budget_") for r in reasons), reasons
    assert "kv_cache_full" in reasons, reasons
    assert any(r.startswith("shed_") for r in reasons), reasons
    assert ("long", BreakerLevel.L0, None) in routes
    assert ("fallback", BreakerLevel.L3, "deepseek-v4-lite") in routes, routes
    assert ("default", BreakerLevel.L2, None) in routes, routes
    assert len(sidecar.sidecar.path.decider.inflight) == len(running)
    assert len(simulator.sidecar.decider.inflight) == len(running)
