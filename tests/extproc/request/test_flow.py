"""The per-request decision without gRPC: identity, parsing, estimation, routing, limits."""

from __future__ import annotations

import dataclasses
import json
import random
import string
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from admission.chain import AdmissionChain
from admission.decision import Admitted, Applicant, CountKind, RequestOutcome, RoutingDecision
from admission.errors import (
    BodyTooLarge,
    ContextLengthExceeded,
    InvalidRequest,
    MethodNotAllowed,
    NoEndpoint,
    NotFound,
    Overloaded,
    RequestRejected,
    Unauthenticated,
)
from engines.picker import EnginePicker
from engines.prefix import PromptBlocks, prompt_blocks
from engines.state import EngineFleet
from extproc.request.flow import Decider
from extproc.request.identity import ApiKeyResolver
from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.prompt import PromptCount, PromptCounter
from extproc.request.verdicts import Routed
from extproc.service.replies import upstream_headers
from policy.domain import Pool
from policy.loader import parse_policy
from policy.schema import Policy

POLICY = parse_policy(
    {
        "model": {"max_context_tokens": 131072, "default_max_tokens": 512},
        "request": {"max_body_bytes": 1_000_000},
        "keys": [
            {"key": "sk-a", "tenant": "team-a", "tier": "critical"},
            {"key": "sk-b", "tenant": "team-b", "tier": "sheddable"},
        ],
    }
)
HEADERS = {
    ":path": "/v1/chat/completions",
    ":method": "POST",
    "authorization": "Bearer sk-a",
    "x-request-id": "rid-1",
}


_BPE = DeepSeekBpe()


def decider(policy: Policy = POLICY, exact: bool = True) -> Decider:
    counter = PromptCounter(_BPE if exact else None, policy.counting, ThreadPoolExecutor(1))
    return Decider(policy=lambda: policy, identity=ApiKeyResolver(), counter=counter)


def body(content: str = "hello", **fields: Any) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **fields}).encode()


async def route(
    raw: bytes, headers: dict[str, str] | None = None, d: Decider | None = None
) -> Routed:
    flow = (d or decider()).new_flow()
    verdict = await flow.on_request_headers(headers or HEADERS, end_of_stream=False)
    assert verdict.inference
    return await flow.on_request_body(raw)


async def decide(
    raw: bytes, headers: dict[str, str] | None = None, d: Decider | None = None
) -> RoutingDecision:
    return (await route(raw, headers, d)).decision


async def test_short_request_routes_default_with_identity() -> None:
    decision = await decide(body("hi there", max_tokens=10))
    assert decision.pool == "default" and decision.bucket.name == "0-4k"
    assert decision.caller.tenant == "team-a" and decision.max_tokens == 10
    headers = upstream_headers(decision)
    assert headers["x-slogate-pool"] == "default" and headers["x-slogate-tier"] == "critical"
    assert decision.request_id == "rid-1"


async def test_default_max_tokens_is_charged_when_absent() -> None:
    decision = await decide(body("hi"))
    assert decision.max_tokens == 512


async def test_long_context_routes_long() -> None:
    decision = await decide(body(" word" * 40_000, max_tokens=100))
    assert decision.pool == "long" and decision.bucket.name == "32k-128k"


async def test_max_tokens_alone_can_move_a_request_to_long() -> None:
    decision = await decide(body("short prompt", max_tokens=40_000))
    assert decision.pool == "long"


async def test_context_over_model_max_is_refused() -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        await decide(body("hi", max_tokens=131_072))
    assert "131072" in info.value.message and info.value.status == 400


async def test_prompts_are_counted_exactly_and_histories_once() -> None:
    d = decider()
    sentence = "The quick brown fox jumps over the lazy dog near the river bank. "
    prompt = sentence * 2000
    decision = await decide(body(prompt, max_tokens=16), d=d)
    assert decision.estimate is CountKind.EXACT
    assert (
        decision.prompt_tokens == _BPE.count(prompt) + POLICY.counting.per_message_overhead_tokens
    )
    again = await decide(body(prompt, max_tokens=16), d=d)
    assert again.estimate is CountKind.CACHED and again.prompt_tokens == decision.prompt_tokens


async def test_crafted_text_is_counted_as_the_model_counts_it() -> None:
    """480 KB of random letters is ~260k real tokens: refused at the model maximum, although
    the fitted estimate took it for 30k (the bypass this rule closes)."""
    rng = random.Random(3)
    letters = "".join(rng.choice(string.ascii_letters) for _ in range(480_000))
    with pytest.raises(ContextLengthExceeded):
        await decide(body(letters, max_tokens=16))
    medium = letters[:40_000]  # ~25k real tokens: the 8-32k bucket, not 0-4k
    decision = await decide(body(medium, max_tokens=16))
    assert decision.bucket.name == "8-32k" and decision.prompt_tokens > 20_000


async def test_without_a_tokenizer_the_byte_bound_decides_on_the_safe_side() -> None:
    d = decider(exact=False)
    decision = await decide(body(" word" * 6000, max_tokens=16), d=d)  # 6k real, 30 KB
    assert decision.estimate is CountKind.BOUND and decision.prompt_tokens >= 30_000
    assert decision.bucket.name == "8-32k"  # over-counted: dearer, never cheaper


async def test_a_busy_counter_never_refuses_as_too_long() -> None:
    d = decider()
    d.counter.queued_bytes = POLICY.counting.queue_max_bytes  # everyone else is counting
    with pytest.raises(Overloaded) as info:
        await decide(body("w" * 140_000, max_tokens=16), d=d)  # the bound: over the max
    assert info.value.reason == "token_count_busy" and info.value.retry_after_s == 1
    small = await decide(body("w" * 10_000, max_tokens=16), d=d)
    assert small.estimate is CountKind.BUSY and small.prompt_tokens >= 10_000


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({":path": "/v1/chat/completions", ":method": "POST"}, Unauthenticated),
        ({**HEADERS, "authorization": "Bearer sk-zzz"}, Unauthenticated),
        ({**HEADERS, "authorization": "Basic abc"}, Unauthenticated),
        ({**HEADERS, ":method": "GET"}, MethodNotAllowed),
        ({**HEADERS, "content-length": "2000000"}, BodyTooLarge),
    ],
)
async def test_header_phase_rejections(
    headers: dict[str, str], error: type[RequestRejected]
) -> None:
    with pytest.raises(error):
        await decider().new_flow().on_request_headers(headers, end_of_stream=False)


async def test_x_api_key_header_is_accepted_and_bodyless_post_refused() -> None:
    headers = {":path": "/v1/completions", ":method": "POST", "x-api-key": "sk-b"}
    verdict = await decider().new_flow().on_request_headers(headers, end_of_stream=False)
    assert verdict.caller is not None and verdict.caller.tenant == "team-b"
    with pytest.raises(InvalidRequest):
        await decider().new_flow().on_request_headers(headers, end_of_stream=True)


async def test_public_paths_skip_the_body_and_strip_slogate_headers() -> None:
    verdict = (
        await decider()
        .new_flow()
        .on_request_headers(
            {":path": "/health?x=1", ":method": "GET", "x-slogate-pool": "long"}, end_of_stream=True
        )
    )
    assert not verdict.inference and verdict.strip_headers == ("x-slogate-pool",)
    assert verdict.caller is None and verdict.routed is None


@pytest.mark.parametrize(
    "path", ["/v1/x", "/V1/chat/completions", "/v1/chat/completions/batch", "/scale_elastic_ep"]
)
async def test_unknown_paths_are_not_found_even_without_a_key(path: str) -> None:
    with pytest.raises(NotFound) as info:
        await (
            decider()
            .new_flow()
            .on_request_headers({":path": path, ":method": "POST"}, end_of_stream=False)
        )
    assert info.value.status == 404


async def test_cheap_apis_need_a_key_and_count_as_one_request() -> None:
    d = decider()
    with pytest.raises(Unauthenticated):
        await d.new_flow().on_request_headers({":path": "/v1/models", ":method": "GET"}, True)
    flow = d.new_flow()
    verdict = await flow.on_request_headers(
        {**HEADERS, ":path": "/v1/models/", ":method": "GET"}, True
    )
    assert not verdict.inference and verdict.routed is not None
    decision = verdict.routed.decision
    assert decision.api.name == "models" and not decision.meters_tokens
    assert decision.reserved_tokens == 0 and d.inflight.pop(verdict.routed.tracking_id) is decision
    with pytest.raises(MethodNotAllowed) as info:
        await d.new_flow().on_request_headers({**HEADERS, ":path": "/v1/models"}, True)
    assert info.value.headers["allow"] == "GET"


async def test_n_multiplies_what_is_reserved_and_is_capped() -> None:
    decision = await decide(body("hi", max_tokens=100, n=8))
    assert decision.sequences == 8 and decision.context_tokens == decision.prompt_tokens + 100
    assert decision.reserved_tokens == decision.prompt_tokens + 800
    with pytest.raises(InvalidRequest) as info:
        await decide(body("hi", max_tokens=100, n=17))  # max_sequences defaults to 16
    assert info.value.reason == "too_many_sequences"


async def test_the_charged_limit_reaches_the_engine() -> None:
    routed = await route(body("hi"))
    assert routed.new_body is not None and json.loads(routed.new_body)["max_tokens"] == 512
    named = await route(body("hi", max_tokens=7))
    assert named.new_body is None


async def test_other_apis_route_like_chat() -> None:
    d = decider()
    flow = d.new_flow()
    await flow.on_request_headers({**HEADERS, ":path": "/v1/messages"}, end_of_stream=False)
    routed = await flow.on_request_body(
        json.dumps({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}).encode()
    )
    assert routed.decision.api.name == "messages" and routed.decision.max_tokens == 9
    assert flow.error_style.value == "anthropic"


async def test_body_over_limit_without_content_length() -> None:
    with pytest.raises(BodyTooLarge):
        await decide(body("x" * 1_100_000))


async def test_stream_gets_usage_requested() -> None:
    routed = await route(body("hi", stream=True))
    assert routed.decision.stream and routed.new_body is not None
    assert json.loads(routed.new_body)["stream_options"]["include_usage"] is True


async def test_routed_requests_wait_in_flight_by_their_own_id() -> None:
    d = decider()
    first = await route(body("a"), d=d)
    second = await route(body("b"), d=d)  # same x-request-id from the client: no collision
    assert first.tracking_id != second.tracking_id and len(d.inflight) == 2
    assert d.inflight.pop(first.tracking_id) is first.decision


class _BlocksAsked(PromptCounter):
    """The exact counter, noting the block size each count hashed in."""

    def __init__(self) -> None:
        super().__init__(_BPE, POLICY.counting, ThreadPoolExecutor(1))
        self.block_tokens: list[int] = []

    async def count(self, texts: Any, token_ids: int = 0, block_tokens: int = 0) -> PromptCount:
        self.block_tokens.append(block_tokens)
        return await super().count(texts, token_ids, block_tokens)


class _PickerSeen:
    """A picker that wants blocks and notes those of each request (Envoy balances)."""

    def __init__(self) -> None:
        self.blocks: list[PromptBlocks] = []

    def wants_blocks(self, policy: Policy) -> bool:
        return True

    def pick(
        self, request_id: str, spec: Pool, blocks: PromptBlocks, *rest: object
    ) -> tuple[str, ...]:
        self.blocks.append(blocks)
        return ()


def _with_block_tokens(policy: Policy, block_tokens: int) -> Policy:
    picking = dataclasses.replace(policy.engines.picking, block_tokens=block_tokens)
    return dataclasses.replace(policy, engines=dataclasses.replace(policy.engines, picking=picking))


async def test_a_reload_between_the_phases_leaves_the_request_on_its_snapshot() -> None:
    """The policy taken with the headers counts and hashes the body's prompt: a reload
    between the two phases (here, a new block size) applies to the next request only."""
    before, after = _with_block_tokens(POLICY, 16), _with_block_tokens(POLICY, 32)
    current = [before]
    counter, picker = _BlocksAsked(), _PickerSeen()
    d = Decider(
        policy=lambda: current[0],
        identity=ApiKeyResolver(),
        counter=counter,
        picker=cast(EnginePicker, picker),
    )
    prompt = "The quick brown fox jumps over the lazy dog near the river bank. " * 40
    flow = d.new_flow()
    await flow.on_request_headers(HEADERS, end_of_stream=False)
    current[0] = after  # reloaded while the body is on its way
    await flow.on_request_body(body(prompt, max_tokens=16))
    assert counter.block_tokens == [16]
    fresh = await PromptCounter(_BPE, POLICY.counting, ThreadPoolExecutor(1)).count([prompt], 0, 16)
    assert fresh.blocks is not None and fresh.lengths is not None
    assert picker.blocks == [prompt_blocks(fresh.blocks, fresh.lengths, 16)]
    await route(body(prompt, max_tokens=16), d=d)  # the next request reads the new one
    assert counter.block_tokens == [16, 32]


class _HeldSteps:
    """An admission step that notes what it holds; `during` runs while it admits (the
    engines may die while a request waits for room)."""

    def __init__(self, during: Callable[[], None] = lambda: None) -> None:
        self.held: set[str] = set()
        self.admitted = 0
        self._during = during

    async def admit(self, applicant: Applicant) -> Admitted:
        self.admitted += 1
        self.held.add(applicant.request_id)
        self._during()
        return Admitted(applicant.decision)

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        self.held.discard(request_id)

    async def settle(self, outcome: RequestOutcome) -> None:
        pass


ENGINE_A, ENGINE_B = ("10.0.0.1", 8000), ("10.0.0.2", 8000)


def _picking(step: _HeldSteps) -> tuple[Decider, EngineFleet]:
    fleet = EngineFleet(lambda: POLICY.engines.health, lambda: 0.0)
    fleet.sync("default", [ENGINE_A, ENGINE_B])
    picker = EnginePicker(fleet, lambda: POLICY, lambda: 0.0)
    counter = PromptCounter(_BPE, POLICY.counting, ThreadPoolExecutor(1))
    d = Decider(
        policy=lambda: POLICY,
        identity=ApiKeyResolver(),
        counter=counter,
        admission=AdmissionChain([step]),
        picker=picker,
    )
    return d, fleet


async def _hinted(d: Decider, hint: frozenset[str] | None) -> Routed:
    flow = d.new_flow()
    flow.subset_hint = hint
    await flow.on_request_headers(HEADERS, end_of_stream=False)
    return await flow.on_request_body(body("hello"))


async def test_a_subset_hint_narrows_the_engines_named() -> None:
    step = _HeldSteps()
    d, _ = _picking(step)
    routed = await _hinted(d, frozenset({"10.0.0.2:8000", "10.9.9.9:1"}))
    assert routed.decision.engines == ("10.0.0.2:8000",)
    assert (await _hinted(d, None)).decision.engines[0] in {"10.0.0.1:8000", "10.0.0.2:8000"}


@pytest.mark.parametrize("hint", [frozenset({"10.9.9.9:1"}), frozenset()])
async def test_a_hint_no_engine_of_the_pool_is_in_is_refused_before_admission(
    hint: frozenset[str],
) -> None:
    step = _HeldSteps()
    d, fleet = _picking(step)
    with pytest.raises(NoEndpoint) as refused:
        await _hinted(d, hint)
    assert refused.value.status == 503 and refused.value.reason == "no_hinted_endpoint"
    assert step.admitted == 0 and fleet.holds == 0 and len(d.inflight) == 0


async def test_a_hinted_engine_gone_while_admitted_releases_what_the_request_held() -> None:
    fleets: list[EngineFleet] = []

    def engine_b_dies() -> None:
        for _ in range(POLICY.engines.health.unhealthy_after):
            fleets[0].probed("default", "10.0.0.2:8000", False)

    step = _HeldSteps(engine_b_dies)
    d, fleet = _picking(step)
    fleets.append(fleet)
    with pytest.raises(NoEndpoint):
        await _hinted(d, frozenset({"10.0.0.2:8000"}))
    assert step.admitted == 1 and step.held == set()  # admitted, then given back
    assert fleet.holds == 0 and len(d.inflight) == 0


async def test_a_clients_destination_header_is_stripped() -> None:
    verdict = (
        await decider()
        .new_flow()
        .on_request_headers(
            {**HEADERS, "x-gateway-destination-endpoint": "10.9.9.9:1"}, end_of_stream=False
        )
    )
    assert verdict.strip_headers == ("x-gateway-destination-endpoint",)
