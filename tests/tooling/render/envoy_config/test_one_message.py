"""The one-message configuration (policy `data_path.messages: one`): what the bootstrap holds,
and that the fragment for a foreign Envoy and the mesh manifests refuse it. The real Envoy
accepts it: tests/e2e/tooling/render/envoy_config/test_one_message.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extproc.request.contract import (
    EXT_PROC_FILTER,
    FORWARDED_NAMESPACE,
    POOL_ROUTE_PREFIX,
    SIDECAR_SET_HEADERS,
)
from policy._data_path import ExtProcMessages
from policy.loader import parse_policy
from tests.support.envoy_config import bootstrap_manager, one_message_bootstrap
from tests.support.mesh import ENVOY_GATEWAY, ISTIO
from tests.support.messages import with_messages
from tests.support.stack import example_policy, write_policy
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.fragment import build_fragment
from tooling.render.envoy_config.one_message import FORWARD_FILTER, HOLD_FILTER
from tooling.render.mesh import MeshError, render_istio
from tooling.render.mesh_gateway import render_envoy_gateway


def test_the_bootstrap_skips_headers_and_keeps_every_path_guarded() -> None:
    manager = bootstrap_manager(one_message_bootstrap())
    names = [f["name"] for f in manager["httpFilters"]]
    at = names.index(EXT_PROC_FILTER)
    assert names[at - 1 : at + 2] == [FORWARD_FILTER, EXT_PROC_FILTER, HOLD_FILTER]
    processor = manager["httpFilters"][at]["typedConfig"]
    assert processor["processingMode"]["requestHeaderMode"] == "SKIP"
    assert processor["processingMode"]["requestBodyMode"] == "BUFFERED"
    forwarded = processor["metadataOptions"]["forwardingNamespaces"]["untyped"]
    assert forwarded == [FORWARDED_NAMESPACE]
    routes = {r["name"]: r for r in manager["routeConfig"]["virtualHosts"][0]["routes"]}
    # Every inference path: Envoy's 400 for a declared empty body, then two messages for a
    # request that declares no length, then its own route.
    chat = "/v1/chat/completions"
    order = list(routes)
    empty, other_method, undeclared = (
        f"{name}:{chat}" for name in ("empty_body", "empty_body_other_method", "undeclared_length")
    )
    own = order.index(f"forwarded:{chat}")
    assert order.index(empty) < order.index(other_method) < own
    assert order.index(undeclared) < own
    assert routes[empty]["directResponse"]["status"] == 400
    for headers_first in (other_method, undeclared):
        per_route = routes[headers_first]["typedPerFilterConfig"][EXT_PROC_FILTER]
        assert per_route["overrides"]["processingMode"]["requestHeaderMode"] == "SEND"
    # Paths whose body is not read keep their header message.
    for path in ("/v1/models", "/health"):
        mode = routes[f"forwarded:{path}"]["typedPerFilterConfig"][EXT_PROC_FILTER]
        assert mode["overrides"]["processingMode"]["requestHeaderMode"] == "SEND"
        assert f"empty_body:{path}" not in routes
    # The pool routes write the sidecar's upstream headers, over any client copy.
    pool_route = routes[f"{POOL_ROUTE_PREFIX}default"]
    added = {h["header"]["key"]: h for h in pool_route["requestHeadersToAdd"]}
    for name in SIDECAR_SET_HEADERS:
        assert added[name]["appendAction"] == "OVERWRITE_IF_EXISTS_OR_ADD"


def test_the_two_message_bootstrap_has_none_of_it() -> None:
    manager = bootstrap_manager(build_bootstrap(parse_policy(example_policy())))
    names = [f["name"] for f in manager["httpFilters"]]
    assert FORWARD_FILTER not in names and HOLD_FILTER not in names
    routes = manager["routeConfig"]["virtualHosts"][0]["routes"]
    assert not any(r["name"].startswith(("empty_body:", "undeclared_length:")) for r in routes)
    assert not any("requestHeadersToAdd" in r for r in routes)


def test_the_fragment_refuses_one_message() -> None:
    policy = parse_policy(with_messages(example_policy(), ExtProcMessages.ONE))
    with pytest.raises(ValueError, match="messages: one"):
        build_fragment(policy)


@pytest.mark.parametrize("render", [render_istio, render_envoy_gateway])
def test_the_mesh_manifests_refuse_one_message(tmp_path: Path, render: Any) -> None:
    policy = write_policy(
        tmp_path / "policy.yaml", with_messages(example_policy(), ExtProcMessages.ONE)
    )
    target = ISTIO if render is render_istio else ENVOY_GATEWAY
    with pytest.raises(MeshError, match="messages: one"):
        render(policy, target)
