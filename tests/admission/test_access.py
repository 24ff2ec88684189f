"""What a tenant's entry does to its requests, with the real request flow, replies and
breaker: a suspended tenant, a limit of 0 and a pool it may not use are refused at once
(403, named), and a tenant's own SLO drives the breaker as its tier's does."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from admission.decision import RequestOutcome
from admission.errors import LimitZero, PoolNotAllowed, RequestRejected, TenantSuspended
from admission.signals import record_signals
from breaker.board import BreakerBoard, p99_over_slo
from breaker.latency import ResponseWindows
from breaker.levels import BreakerLevel
from extproc.request.flow import Decider
from extproc.request.identity import ApiKeyResolver
from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.verdicts import Routed
from extproc.service.replies import rejection
from policy.apis import ErrorStyle
from policy.loader import parse_policy
from policy.schema import Policy
from tests.support.clock import VirtualClock
from tests.support.decisions import decision, outcome

_BPE = DeepSeekBpe()
POLICY = parse_policy(
    {
        "tenants": {
            "defaults": {},
            "list": {
                "frozen": {"suspended": True},
                "short-only": {"pools": ["default"]},
                "no-tokens": {"limits": {"tokens_per_minute": 0}},
                "no-requests": {"limits": {"requests_per_minute": 0}},
            },
        },
        "keys": [
            {"key": f"sk-{name}", "tenant": name}
            for name in ("frozen", "short-only", "no-tokens", "no-requests", "anyone")
        ],
    }
)


def decider(policy: Policy = POLICY) -> Decider:
    counter = PromptCounter(_BPE, policy.counting, ThreadPoolExecutor(1))
    return Decider(policy=lambda: policy, identity=ApiKeyResolver(), counter=counter)


def headers(key: str, path: str = "/v1/chat/completions") -> dict[str, str]:
    return {":path": path, ":method": "POST", "authorization": f"Bearer {key}"}


def body(words: int = 2, **fields: Any) -> bytes:
    messages = [{"role": "user", "content": " hello" * words}]
    return json.dumps({"messages": messages, "max_tokens": 16, **fields}).encode()


async def send(key: str, raw: bytes) -> Routed:
    flow = decider().new_flow()
    await flow.on_request_headers(headers(key), end_of_stream=False)
    return await flow.on_request_body(raw)


def reply_of(error: RequestRejected, style: ErrorStyle = ErrorStyle.OPENAI) -> dict[str, Any]:
    immediate = rejection(error, style).immediate_response
    found = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    return {"status": immediate.status.code, "body": json.loads(immediate.body), **found}


async def test_a_suspended_tenant_is_refused_before_its_body_is_read() -> None:
    flow = decider().new_flow()
    with pytest.raises(TenantSuspended) as refused:
        await flow.on_request_headers(headers("sk-frozen"), end_of_stream=False)
    reply = reply_of(refused.value)
    assert reply["status"] == 403 and reply["x-slogate-reason"] == "tenant_suspended"
    error = reply["body"]["error"]
    assert error["code"] == "tenant_suspended" and error["type"] == "request_forbidden"
    assert "'frozen' is suspended" in error["message"]
    anthropic = reply_of(refused.value, ErrorStyle.ANTHROPIC)["body"]
    assert anthropic["error"]["type"] == "permission_error"
    assert (await send("sk-anyone", body())).decision.caller.tenant == "anyone"


async def test_a_suspended_tenant_is_refused_on_every_path_to_admission() -> None:
    """The simulator and an identity of its own reach admission without the header check."""
    frozen = POLICY.key_for("sk-frozen")
    assert frozen is not None
    with pytest.raises(TenantSuspended):
        await decider().admit(decision(caller=frozen), POLICY)


async def test_a_tenant_is_refused_a_pool_it_may_not_use() -> None:
    assert (await send("sk-short-only", body())).decision.pool == "default"
    with pytest.raises(PoolNotAllowed) as refused:
        await send("sk-short-only", body(words=2, max_tokens=40_000))  # the long pool's
    reply = reply_of(refused.value)
    assert reply["status"] == 403 and reply["x-slogate-reason"] == "pool_not_allowed"
    message = reply["body"]["error"]["message"]
    assert "'short-only' may not use the 'long' pool" in message and "default" in message
    assert (await send("sk-anyone", body(max_tokens=40_000))).decision.pool == "long"


async def test_a_limit_of_zero_is_refused_with_a_clear_reason_not_a_429() -> None:
    flow = decider().new_flow()
    with pytest.raises(LimitZero) as no_requests:
        await flow.on_request_headers(headers("sk-no-requests"), end_of_stream=False)
    assert "requests_per_minute limit is 0" in no_requests.value.message
    with pytest.raises(LimitZero) as no_tokens:
        await send("sk-no-tokens", body())
    reply = reply_of(no_tokens.value)
    assert reply["status"] == 403 and reply["x-slogate-reason"] == "limit_zero"
    assert "tokens_per_minute limit is 0 (tenant 'no-tokens')" in reply["body"]["error"]["message"]
    # A request that meters no tokens (the model list) is not barred by a token limit.
    models = decider().new_flow()
    verdict = await models.on_request_headers(
        {**headers("sk-no-tokens", "/v1/models"), ":method": "GET"}, end_of_stream=True
    )
    assert verdict.routed is not None


def finished(policy: Policy, tenant: str, ttft_s: float) -> RequestOutcome:
    """A streamed critical request of `tenant` whose first token came after `ttft_s`."""
    key = policy.key_for(f"sk-{tenant}")
    assert key is not None
    return outcome(decision(1000, caller=key, stream=True, policy=policy), ttft_s=ttft_s)


@pytest.mark.parametrize(("tenant", "expected"), [("strict", BreakerLevel.L2), ("lax", None)])
def test_a_tenants_own_slo_drives_the_breaker_as_its_tiers_does(
    tenant: str, expected: BreakerLevel | None
) -> None:
    """The same first tokens at 500 ms: within the critical tier's 2 s SLO, twice the strict
    tenant's 250 ms. Its requests alone trip the breaker (2x its SLO: past L2's 1.5x)."""
    policy = parse_policy(
        {
            "slos": {"critical": {"default": 2000}},
            "breaker": {"min_samples": 10, "thresholds": {"enter_hold_s": [1, 1, 1]}},
            "tenants": {
                "classes": {"fast": {"tier": "critical", "slo": {"ttft_p99_ms": 250}}},
                "list": {"strict": "fast", "lax": {"tier": "critical"}},
            },
            "keys": [{"key": "sk-strict", "tenant": "strict"}, {"key": "sk-lax", "tenant": "lax"}],
        }
    )
    clock = VirtualClock(1000.0)
    windows = ResponseWindows(clock)
    board = BreakerBoard(lambda: policy, windows, lambda pool: None, lambda: None, clock)
    for _ in range(20):
        record_signals(windows, policy, finished(policy, tenant, 0.5))
    ratio = p99_over_slo(windows, policy, "default")
    assert ratio == pytest.approx(2.0 if expected else 0.25, rel=0.06)
    for _ in range(3):
        board.evaluate()
        clock.now_s += 1.0
    assert board.level("default") is (expected or BreakerLevel.L0)
