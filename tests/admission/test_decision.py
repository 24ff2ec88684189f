"""RoutingDecision's own copy (with_engines) against dataclasses.replace."""

from __future__ import annotations

import dataclasses

from admission.decision import CandidateNote, CountKind, RoutingDecision
from breaker.levels import BreakerLevel
from budget.spend import SpendHold
from policy.apis import KNOWN_APIS
from policy.domain import ApiKey, ContextBucket, Limits, Tier

# Every field away from its default: a field the copy missed would read as its default.
EVERY_FIELD_SET = RoutingDecision(
    request_id="r1",
    caller=ApiKey("ab" * 32, "t", Tier.CRITICAL),
    pool="long",
    bucket=ContextBucket("32k-128k", 32769, 131072, 2.5),
    prompt_tokens=41000,
    max_tokens=16,
    estimate=CountKind.CACHED,
    stream=True,
    model_override="fallback",
    api=KNOWN_APIS[1],
    sequences=3,
    runs_to_limit=True,
    prompt_correction=1.25,
    body_bytes=4096,
    waited_s=0.5,
    settle_promptly=True,
    level=BreakerLevel.L2,
    limits=Limits(requests_per_minute=7),
    engines=("old:8000",),
    spend=SpendHold("t", (), {}, 1.5),
    crossed_from="eu",
    may_cross=False,
    candidate=CandidateNote("same"),
)


def test_every_field_of_the_example_is_set() -> None:
    for field in dataclasses.fields(RoutingDecision):
        default = (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        assert getattr(EVERY_FIELD_SET, field.name) != default, field.name


def test_with_engines_is_replace_of_the_engines() -> None:
    picked = EVERY_FIELD_SET.with_engines(("a:8000", "b:8000"))
    assert picked == dataclasses.replace(EVERY_FIELD_SET, engines=("a:8000", "b:8000"))
    assert picked.engines == ("a:8000", "b:8000")
    assert picked.candidate is EVERY_FIELD_SET.candidate  # not compared: the same note
    assert EVERY_FIELD_SET.engines == ("old:8000",)  # the original unchanged (frozen)
