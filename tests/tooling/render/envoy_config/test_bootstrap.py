"""The generated bootstrap, shaped as slogate needs. Accepted by the real Envoy binary:
tests/e2e/tooling/render/envoy_config/test_bootstrap.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from extproc.request.contract import ACCESS_LOG_TAGS, EXT_PROC_FILTER, USAGE_TAP_FILTER
from extproc.service.replies import WAIT_REPLY_MARGIN_MS, wait_reply_ms
from policy.domain import Tier
from policy.loader import load_policy
from tests.support.envoy_config import bootstrap_manager
from tests.support.stack import EXAMPLE_POLICY
from tooling.render.envoy_config.bootstrap import build_bootstrap


def test_bootstrap_shape() -> None:
    policy = load_policy(EXAMPLE_POLICY)
    manager = bootstrap_manager(build_bootstrap(policy))
    names = [f["name"] for f in manager["httpFilters"]]
    assert names == [EXT_PROC_FILTER, USAGE_TAP_FILTER, "envoy.filters.http.router"]
    ext_proc = manager["httpFilters"][0]["typedConfig"]
    mode = ext_proc["processingMode"]
    assert mode["requestBodyMode"] == "BUFFERED"
    assert mode["responseHeaderMode"] == "SKIP"  # Python stays off the response path
    assert ext_proc.get("failureModeAllow", False) is False  # closed by default
    assert ext_proc["allowModeOverride"] is True
    # The path the sidecar and the routes decide on is the one the engines act on.
    assert manager["normalizePath"] is True and manager["mergeSlashes"] is True
    assert manager["pathWithEscapedSlashesAction"] == "UNESCAPE_AND_FORWARD"
    routes = manager["routeConfig"]["virtualHosts"][0]["routes"]
    pools = routes[:3]
    assert [r["route"]["cluster"] for r in pools] == ["default", "long", "fallback"]
    for r in pools:  # only the sidecar's metadata picks a pool, never a client header
        assert "headers" not in r["match"] and r["match"]["dynamicMetadata"]
    forwarded = {r["name"]: r for r in routes[3:-2]}
    assert set(forwarded) == {f"forwarded:{p}" for p in policy.paths.forwarded_paths}
    assert all(r["route"]["cluster"] == "default" for r in forwarded.values())
    # /health is fail-open in the example policy; inference paths keep the closed default.
    health = forwarded["forwarded:/health"]["typedPerFilterConfig"]
    assert health[EXT_PROC_FILTER]["overrides"]["failureModeAllow"] is True
    assert "typedPerFilterConfig" not in forwarded["forwarded:/v1/chat/completions"]
    # Default deny: everything else is Envoy's own 404, without asking the sidecar.
    assert [r["name"] for r in routes[-2:]] == ["not_found:messages", "not_found"]
    assert all(int(r["directResponse"]["status"]) == 404 for r in routes[-2:])
    vhost = manager["routeConfig"]["virtualHosts"][0]
    assert int(vhost["requestBodyBufferLimit"]) == policy.max_body_bytes
    tags = manager["accessLog"][0]["typedConfig"]["commonConfig"]["customTags"]
    assert {t["tag"] for t in tags} == set(ACCESS_LOG_TAGS)


@pytest.mark.parametrize(("waits", "upstream_s"), [({}, 600.0), ({"sheddable": 900}, 600.0)])
def test_envoy_lets_the_longest_wait_through_and_no_longer(
    waits: dict[str, float], upstream_s: float
) -> None:
    """The sidecar's override for a waiting request (its wait + the message timeout + the
    margin that lets the room's own 503 come first) must be within max_message_timeout, or
    Envoy ignores it (it does not cap it); the stream idle timer runs during the wait, so
    it must outlast it (ENVOY notes in docs/operators/deploy-envoy.md, measured on Envoy 1.40)."""
    policy = load_policy(EXAMPLE_POLICY)
    room = dataclasses.replace(
        policy.waiting_room,
        max_wait_s={**policy.waiting_room.max_wait_s, **{Tier(t): w for t, w in waits.items()}},
    )
    policy = dataclasses.replace(policy, waiting_room=room, upstream_timeout_s=upstream_s)
    manager = bootstrap_manager(build_bootstrap(policy))
    ext_proc = manager["httpFilters"][0]["typedConfig"]
    longest_ms = policy.message_timeout_ms + policy.longest_wait_s * 1000 + WAIT_REPLY_MARGIN_MS
    assert WAIT_REPLY_MARGIN_MS >= 5000  # stalls of up to 5 s were measured (replies.py)
    assert _seconds(ext_proc["messageTimeout"]) == policy.message_timeout_ms / 1000
    max_ms = round(_seconds(ext_proc["maxMessageTimeout"]) * 1000)
    assert max_ms == wait_reply_ms(policy.longest_wait_s, policy.message_timeout_ms)
    assert longest_ms <= max_ms < longest_ms + 1
    # Every override the sidecar may send is honoured: each tier's and bucket's wait.
    for tier in Tier:
        for bucket in policy.buckets:
            for prompt in (0, 1_000, 100_000):
                wait_s = min(
                    policy.longest_wait_s,
                    policy.max_wait_s(tier, policy.default_pool, bucket.name, prompt),
                )
                assert wait_reply_ms(wait_s, policy.message_timeout_ms) <= max_ms
    assert _seconds(manager["streamIdleTimeout"]) * 1000 > max_ms
    assert _seconds(manager["streamIdleTimeout"]) >= upstream_s


@pytest.mark.parametrize(
    ("wait_s", "message_timeout_ms"),
    # (wait + message timeout) x 1000 in floating point rounds 1 ms up for the first three.
    [(0.257, 1000), (1.006, 1000), (0.264, 2000), (0.1 + 0.2, 1000), (1 / 3, 250), (20.0, 1000)],
)
def test_an_override_for_the_longest_wait_is_never_above_max_message_timeout(
    wait_s: float, message_timeout_ms: int
) -> None:
    """Milliseconds rounded up from the wait alone: floating point cannot push the longest
    wait's override 1 ms past the filter's max_message_timeout (Envoy would then ignore it
    and answer 504 after the plain message timeout)."""
    policy = load_policy(EXAMPLE_POLICY)
    room = dataclasses.replace(policy.waiting_room, max_wait_s={Tier.CRITICAL: wait_s})
    policy = dataclasses.replace(
        policy, waiting_room=room, slo_ttft_p99_ms={}, message_timeout_ms=message_timeout_ms
    )
    assert policy.longest_wait_s == wait_s
    ext_proc = bootstrap_manager(build_bootstrap(policy))["httpFilters"][0]["typedConfig"]
    max_ms = round(_seconds(ext_proc["maxMessageTimeout"]) * 1000)
    assert wait_reply_ms(wait_s, policy.message_timeout_ms) <= max_ms
    assert max_ms >= wait_s * 1000 + policy.message_timeout_ms + WAIT_REPLY_MARGIN_MS


def _seconds(duration: str) -> float:
    return float(duration.rstrip("s"))


def test_committed_bootstrap_matches_the_example_policy() -> None:
    """envoy/bootstrap.json is generated (`make envoy-config`); it must never drift."""
    committed = Path(__file__).resolve().parents[4] / "envoy" / "bootstrap.json"
    generated = build_bootstrap(load_policy(EXAMPLE_POLICY))
    assert json.loads(committed.read_text()) == generated, "run `make envoy-config`"
