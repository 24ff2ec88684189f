"""The fragment (`slogate envoy-config --fragment`) and its merge into a bootstrap someone
else wrote: the contract's rules (docs/operators/deploy-envoy.md), one by one. The real
Envoy's verdict: tests/e2e/tooling/render/envoy_config/test_fragment.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extproc.request.contract import (
    ENVOY_PIECES,
    EXT_PROC_FILTER,
    POOL_ROUTE_PREFIX,
    SIDECAR_CLUSTER,
    USAGE_TAP_FILTER,
)
from extproc.service.replies import WAIT_REPLY_MARGIN_MS, wait_reply_ms
from policy.loader import load_policy
from tests.support.envoy_config import POOLS, fragment, theirs
from tests.support.stack import EXAMPLE_POLICY
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.fragment import (
    MergeError,
    build_fragment,
    merge_fragment,
)
from tooling.render.envoy_config.profile import EnvoyPorts, SidecarTls


def manager(config: dict[str, Any]) -> dict[str, Any]:
    chain = config["static_resources"]["listeners"][0]["filter_chains"][0]
    typed: dict[str, Any] = chain["filters"][0]["typed_config"]
    return typed


def test_the_fragment_is_slogates_pieces_of_the_bootstrap() -> None:
    """The same typed pieces the whole bootstrap is made of: one source for both."""
    policy = load_policy(EXAMPLE_POLICY)
    whole = build_bootstrap(policy)
    hcm = whole["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]
    hcm = hcm["typedConfig"]
    piece = build_fragment(policy)
    assert piece["httpFilters"] == hcm["httpFilters"][:-1]  # all but the router
    assert piece["accessLog"] == hcm["accessLog"]
    routes = hcm["routeConfig"]["virtualHosts"][0]["routes"]
    assert piece["poolRoutes"] == routes[: len(policy.pools)]
    for key in ("streamIdleTimeout", "normalizePath", "localReplyConfig"):
        assert piece["httpConnectionManager"][key] == hcm[key]
    sidecar = next(c for c in whole["staticResources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    assert sidecar in piece["clusters"]


def test_pools_go_to_the_operators_clusters() -> None:
    piece = fragment()
    assert {r["name"]: r["route"]["cluster"] for r in piece["poolRoutes"]} == {
        f"{POOL_ROUTE_PREFIX}{pool}": cluster for pool, cluster in POOLS.items()
    }
    # Mapped pools bring no cluster of their own; an unmapped one does.
    assert [c["name"] for c in piece["clusters"]] == [SIDECAR_CLUSTER]
    partial = fragment(pool_clusters={"default": "vllm_main"})
    assert {c["name"] for c in partial["clusters"]} == {SIDECAR_CLUSTER, "long", "fallback"}


def test_the_merge_follows_the_contract() -> None:
    merged, notes = merge_fragment(theirs(), fragment())
    hcm = manager(merged)
    names = [f["name"] for f in hcm["http_filters"]]
    assert names == [EXT_PROC_FILTER, USAGE_TAP_FILTER, "envoy.filters.http.router"]
    assert [log["name"] for log in hcm["access_log"]] == [
        "envoy.access_loggers.stdout",  # theirs kept, ours after it
        "envoy.access_loggers.http_grpc",  # batched
        "envoy.access_loggers.http_grpc",  # settle_promptly: each entry at once
    ]
    assert hcm["stream_idle_timeout"] == "600s" and any("120s" in n for n in notes)
    # Envoy honours the waiting room's override, margin included, for the longest wait.
    policy = load_policy(EXAMPLE_POLICY)
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == EXT_PROC_FILTER)
    longest_ms = wait_reply_ms(policy.longest_wait_s, policy.message_timeout_ms)
    assert float(ext_proc["typedConfig"]["maxMessageTimeout"].removesuffix("s")) * 1000 == (
        longest_ms
    )
    assert longest_ms >= policy.message_timeout_ms + WAIT_REPLY_MARGIN_MS
    vhost = hcm["route_config"]["virtual_hosts"][0]
    routes = {r["name"]: r for r in vhost["routes"]}
    assert [r["name"] for r in vhost["routes"]][:3] == [f"{POOL_ROUTE_PREFIX}{p}" for p in POOLS]
    ext_proc = {
        name: r.get("typed_per_filter_config", {}).get(EXT_PROC_FILTER)
        for name, r in routes.items()
    }
    assert ext_proc["status"]["disabled"] is True  # serves no policy path
    assert ext_proc["docs"]["disabled"] is True
    assert ext_proc["inference"] is None  # /v1/ serves the APIs: the policy-wide mode
    assert ext_proc["health"]["overrides"]["failureModeAllow"] is True  # open by path
    assert vhost["request_body_buffer_limit"] == load_policy(EXAMPLE_POLICY).max_body_bytes
    assert vhost["response_headers_to_add"][0]["header"]["key"] == "x-served-by"  # untouched
    assert {c["name"] for c in merged["static_resources"]["clusters"]} >= {SIDECAR_CLUSTER}


def test_a_route_spanning_failure_modes_keeps_the_policy_wide_one_and_says_so() -> None:
    config = theirs()
    vhost = manager(config)["route_config"]["virtual_hosts"][0]
    vhost["routes"] = [
        {"name": "everything", "match": {"prefix": "/"}, "route": {"cluster": "vllm_main"}}
    ]
    merged, notes = merge_fragment(config, fragment())
    route = manager(merged)["route_config"]["virtual_hosts"][0]["routes"][-1]
    assert EXT_PROC_FILTER not in route.get("typed_per_filter_config", {})
    assert any("'everything' serves paths with different failure modes" in n for n in notes)


def test_settings_are_raised_never_lowered() -> None:
    config = theirs()
    hcm = manager(config)
    hcm["stream_idle_timeout"] = "3600s"
    hcm["route_config"]["virtual_hosts"][0]["request_body_buffer_limit"] = 1 << 30
    merged, _ = merge_fragment(config, fragment())
    assert manager(merged)["stream_idle_timeout"] == "3600s"
    assert (
        manager(merged)["route_config"]["virtual_hosts"][0]["request_body_buffer_limit"] == 1 << 30
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda c: (
                manager(c).pop("route_config") and manager(c).update(rds={"route_config_name": "x"})
            ),
            "RDS",
        ),
        (lambda c: manager(c)["http_filters"].clear(), "without a router"),
        (
            lambda c: c["static_resources"]["clusters"].append({"name": SIDECAR_CLUSTER}),
            "already has a cluster",
        ),
        (lambda c: c["static_resources"]["clusters"].pop(1), "lacks"),
    ],
)
def test_what_cannot_be_merged_is_refused_with_a_reason(change: Any, says: str) -> None:
    config = theirs()
    change(config)
    with pytest.raises(MergeError, match=says):
        merge_fragment(config, fragment())


def test_merging_twice_is_refused() -> None:
    once, _ = merge_fragment(theirs(), fragment())
    with pytest.raises(MergeError, match="merged before"):
        merge_fragment(once, fragment())


def test_an_unknown_listener_is_refused() -> None:
    with pytest.raises(MergeError, match="no static listener named 'nope'"):
        merge_fragment(theirs(), fragment(), listener="nope")


def test_the_input_is_not_changed() -> None:
    config = theirs()
    kept = copy.deepcopy(config)
    merge_fragment(config, fragment())
    assert config == kept


def test_the_docs_state_the_contract() -> None:
    """The docs' table (docs/operators/deploy-envoy.md) is ENVOY_PIECES, rendered
    (`slogate envoy-config --contract`)."""
    from tests.support.docs import all_docs
    from tooling.render.envoy_config.fragment import contract_table

    assert contract_table() in all_docs(), (
        "run `slogate envoy-config --contract` into docs/operators/deploy-envoy.md"
    )
    assert len(ENVOY_PIECES) >= 10


def test_tls_to_the_sidecar_goes_into_the_fragment_and_the_bootstrap() -> None:
    """The sidecar's cluster speaks TLS (h2 by ALPN, its name checked, Envoy's client
    certificate) in both, and the real Envoy takes it (a real handshake:
    tests/e2e/test_sidecar_tls.py)."""
    to_sidecar = SidecarTls("/etc/slogate/tls/ca.crt", "slogate.llm.svc", "/c.pem", "/k.pem")
    piece = fragment(sidecar_tls=to_sidecar)
    socket = next(c for c in piece["clusters"] if c["name"] == SIDECAR_CLUSTER)["transportSocket"]
    context = socket["typedConfig"]
    assert context["sni"] == "slogate.llm.svc"
    common = context["commonTlsContext"]
    assert common["alpnProtocols"] == ["h2"]
    assert common["validationContext"]["trustedCa"] == {"filename": "/etc/slogate/tls/ca.crt"}
    assert common["tlsCertificates"][0]["privateKey"] == {"filename": "/k.pem"}
    whole = build_bootstrap(load_policy(EXAMPLE_POLICY), EnvoyPorts(sidecar_tls=to_sidecar))
    sidecar = next(c for c in whole["staticResources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    assert sidecar["transportSocket"] == socket
    assert "transportSocket" not in next(
        c for c in fragment()["clusters"] if c["name"] == SIDECAR_CLUSTER
    )


def test_a_unix_socket_to_the_sidecar_goes_into_the_fragment_and_the_bootstrap() -> None:
    """`--sidecar-socket`: the sidecar's cluster is a pipe address, STATIC (a path has
    nothing to resolve), in both (a real Envoy through it: tests/e2e/test_sidecar_socket.py)."""
    path = "/var/run/slogate/grpc.sock"
    piece = next(
        c for c in fragment(sidecar_socket=path)["clusters"] if c["name"] == SIDECAR_CLUSTER
    )
    whole = build_bootstrap(load_policy(EXAMPLE_POLICY), EnvoyPorts(sidecar_socket=path))
    assert next(
        c for c in whole["staticResources"]["clusters"] if c["name"] == SIDECAR_CLUSTER
    ) == (piece)
    assert piece["type"] == "STATIC" and "dnsLookupFamily" not in piece
    hosts = piece["loadAssignment"]["endpoints"][0]["lbEndpoints"]
    assert [h["endpoint"]["address"] for h in hosts] == [{"pipe": {"path": path}}]
