"""slogate as an InferencePool's endpoint picker, driven as a gateway drives one.

The Envoy here is configured by hand from the Gateway API inference extension's endpoint
picker protocol (its proposal 004), not from slogate's generator: an ext_proc filter in
the protocol's streaming mode (headers, full-duplex streamed bodies, trailers, both ways)
pointed at the sidecar, with `envoy.lb.subset_hint` and `envoy.lb` forwarded to it and
`envoy.lb` received from it; a cluster of the pool's two simulated engines balanced by
Envoy's override-host policy (the metadata `envoy.lb` / `x-gateway-destination-endpoint`
first, the header second, round robin as its fallback) with retries on connect failure,
so the named fallbacks are tried in order; a Lua filter before ext_proc that turns a test
header into the subset hint, as a gateway would set it; and the endpoint that served
(`x-gateway-destination-endpoint-served`) reported back as the protocol asks of the data
plane, with Envoy's own pieces: the route writes %UPSTREAM_HOST% into a response header and
a header_to_metadata filter after ext_proc copies it into `envoy.lb`. No slogate access
log: the request ends with its ext_proc stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from policy.schema import Policy
from tests.support.http import CHAT, Reply, chat_body, metric, post, scrape
from tests.support.stack import (
    admin_status,
    example_policy,
    fault,
    recorded_ttft_s,
    slogate,
    start_stack,
    time_first_output,
    wait_for,
    write_policy,
)
from tooling.render.envoy_config.profile import EnvoyPorts
from tooling.stack.local import LocalStack

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_HEADER = "x-test-subset"  # what the gateway's own rule turns into the subset hint
SERVED_BY = "x-test-served-by"  # Envoy's %UPSTREAM_HOST%: who really served

# Before ext_proc: the subset hint, from a test header (a gateway sets it from its own
# state; the protocol only says where it goes).
HINT_LUA = f"""
function envoy_on_request(handle)
  local subset = handle:headers():get("{SUBSET_HEADER}")
  if subset == nil then return end
  local endpoints = {{}}
  for endpoint in string.gmatch(subset, "[^,]+") do
    table.insert(endpoints, endpoint)
  end
  handle:streamInfo():dynamicMetadata():set(
    "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", endpoints)
end
"""


def _lua(name: str, code: str) -> dict[str, Any]:
    return {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": code},
        },
    }


def gateway_bootstrap(policy: Policy, ports: EnvoyPorts) -> dict[str, Any]:
    """A gateway's Envoy in front of the pool `default` (the InferencePool), its endpoint
    picker the sidecar; written from the protocol's text."""
    engines = policy.pools["default"].endpoints
    streamed = "FULL_DUPLEX_STREAMED"
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3"
            ".ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}},
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": streamed,
                "request_trailer_mode": "SEND",
                "response_header_mode": "SEND",
                "response_body_mode": streamed,
                "response_trailer_mode": "SEND",
            },
            "message_timeout": "5s",
            "metadata_options": {
                "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint", "envoy.lb"]},
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
            },
        },
    }
    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": "pool",
            "timeout": "60s",
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,reset-before-request",
                "num_retries": 3,
            },
        },
        "response_headers_to_add": [
            {"header": {"key": SERVED_BY, "value": "%UPSTREAM_HOST%"}},
        ],
    }
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [route]}]},
        "http_filters": [
            _lua("subset_hint", HINT_LUA),
            ext_proc,
            # After ext_proc (so on the way back it runs first): the endpoint that served,
            # which the route wrote into a response header from %UPSTREAM_HOST%, copied
            # into `envoy.lb` where the protocol says the picker reads it.
            {
                "name": "served",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http"
                    ".header_to_metadata.v3.Config",
                    "response_rules": [
                        {
                            "header": SERVED_BY,
                            "on_header_present": {
                                "metadata_namespace": "envoy.lb",
                                "key": "x-gateway-destination-endpoint-served",
                                "type": "STRING",
                            },
                            "remove": False,
                        }
                    ],
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }

    def endpoint(host: str, port: int) -> dict[str, Any]:
        return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}

    override_host = {
        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host"
        ".v3.OverrideHost",
        "override_host_sources": [
            {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION}]}},
            {"header": DESTINATION},
        ],
        "fallback_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions"
                            ".load_balancing_policies.round_robin.v3.RoundRobin"
                        },
                    }
                }
            ]
        },
    }
    pool = {
        "name": "pool",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": override_host,
                    }
                }
            ]
        },
        "load_assignment": {
            "cluster_name": "pool",
            "endpoints": [{"lb_endpoints": [endpoint(h, p) for h, p in engines]}],
        },
    }
    epp = {
        "name": "epp",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3"
                ".HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "epp",
            "endpoints": [{"lb_endpoints": [endpoint(ports.host, ports.sidecar_port)]}],
        },
    }
    return {
        "admin": {
            "address": {"socket_address": {"address": ports.host, "port_value": ports.admin_port}}
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {
                        "socket_address": {"address": ports.host, "port_value": ports.listen_port}
                    },
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [pool, epp],
        },
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("endpoint_picker")
    raw = example_policy()
    raw["pools"]["default"]["picker"] = "slogate"
    # Slow probes: an engine stopped by the last test stays named until Envoy finds it
    # refusing connections (a gateway's fallback, not slogate's own health view).
    raw.setdefault("engines", {})["health"] = {"probe_interval_s": 60.0, "unhealthy_after": 3}
    unlimited = {"requests_per_minute": 100_000, "concurrent_requests": 1_000}
    raw["tiers"] = {tier: {**limits, **unlimited} for tier, limits in raw["tiers"].items()}
    policy = write_policy(tmp / "policy.yaml", raw)
    running = start_stack(tmp, policy, exact_tokenizer=False, bootstrap=gateway_bootstrap)
    yield running
    running.stop()


def named(reply: Reply) -> list[str]:
    """The endpoints the sidecar named, as the engine saw the protocol's header."""
    saw = json.loads(reply.headers["x-sim-saw-headers"])
    return saw[DESTINATION].split(",")


def engines(stack: LocalStack) -> list[str]:
    return [f"127.0.0.1:{port}" for port in stack.engine_ports["default"]]


def engine_rows(stack: LocalStack) -> dict[str, dict[str, int]]:
    """This sidecar's view of each engine of the pool: what its requests hold there, how
    many it picked and how many answers it counted for it."""
    return {
        row["endpoint"]: {k: int(row[k]) for k in ("heldRequests", "picked", "answered", "failed")}
        for row in admin_status(stack)["engines"]
        if row["pool"] == "default"
    }


def nothing_held(stack: LocalStack) -> bool:
    return all(row["heldRequests"] == 0 for row in engine_rows(stack).values())


def ask(stack: LocalStack, text: str, **headers: str) -> Reply:
    return post(stack.url, CHAT, chat_body(text), headers=headers or None)


def test_every_request_lands_on_the_endpoint_slogate_named(gateway: LocalStack) -> None:
    served = set()
    for index in range(12):
        reply = ask(gateway, f"conversation {index}: hello")
        assert reply.status == 200, reply.body
        first = named(reply)[0]
        assert first in engines(gateway)
        assert reply.headers[SERVED_BY] == first  # the override-host policy honoured it
        served.add(first)
    assert served == set(engines(gateway))  # and slogate spread them over both engines
    # No access log comes from a gateway: each request ended with its stream, its hold
    # given back.
    assert wait_for(lambda: nothing_held(gateway))


def usage_seen(stack: LocalStack) -> tuple[float, float, float]:
    """Completion tokens read from the answers, answers without usage, requests ended by
    their stream."""
    samples = scrape(stack.metrics_url)
    return (
        metric(samples, "slogate_tokens_total", pool="default", kind="completion"),
        metric(samples, "slogate_usage_missing_total", pool="default"),
        metric(samples, "slogate_access_log_entries_total", kind="stream_end"),
    )


def test_a_streamed_answer_passes_through_and_is_settled_on_its_usage(
    gateway: LocalStack,
) -> None:
    completion, missing, ended = usage_seen(gateway)
    body = chat_body("stream me")
    body["stream"] = True
    reply = post(gateway.url, CHAT, body)
    assert reply.status == 200, reply.body
    text = reply.body.decode()
    assert "data: [DONE]" in text and reply.headers[SERVED_BY] == named(reply)[0]
    assert wait_for(lambda: nothing_held(gateway))
    # Its end came with its stream (no access log here), its usage read from the chunks.
    after = usage_seen(gateway)
    assert after[0] > completion and after[1] == missing and after[2] == ended + 1


def test_a_responses_stream_is_timed_at_its_first_output_event(gateway: LocalStack) -> None:
    """Its first bytes (`response.created`, `response.in_progress`) come before the engine's
    first token: the TTFT the sidecar records from the streamed chunks is the latter's."""
    prefill_s = 0.3
    client: list[float | None] = []

    def send() -> None:
        body = {"input": "time me", "max_output_tokens": 8}
        client.append(
            time_first_output(gateway.listen_port, "/v1/responses", body, "sk-demo-critical")[0]
        )

    fault(gateway, "default", latency_ms=prefill_s * 1000)
    try:
        ttft_s = recorded_ttft_s(gateway, send, "slogate_upstream_ttft_seconds", pool="default")
    finally:
        fault(gateway, "default")
    (client_s,) = client
    assert client_s is not None and prefill_s * 0.99 <= ttft_s <= client_s + 0.005


def test_a_subset_hint_narrows_the_choice(gateway: LocalStack) -> None:
    only = engines(gateway)[1]
    for index in range(6):
        reply = ask(gateway, f"hinted {index}", **{SUBSET_HEADER: only})
        assert reply.status == 200, reply.body
        assert named(reply) == [only] and reply.headers[SERVED_BY] == only


def test_a_hint_naming_no_engine_of_the_pool_is_a_503(gateway: LocalStack) -> None:
    reply = ask(gateway, "nowhere", **{SUBSET_HEADER: "127.0.0.1:1,10.9.9.9:8000"})
    assert reply.status == 503, reply.body
    assert reply.headers["x-slogate-reason"] == "no_hinted_endpoint"
    assert reply.json()["error"]["code"] == "no_endpoint"
    assert nothing_held(gateway)


def test_sheddable_traffic_under_l2_gets_429(gateway: LocalStack) -> None:
    drill = ("drill", "--pool", "default", "--level", "2", "--minutes", "1")
    assert slogate(gateway, *drill).returncode == 0
    try:
        refused = post(gateway.url, CHAT, chat_body("batch"), key="sk-demo-batch")
        assert refused.status == 429, refused.body
        assert refused.headers["x-slogate-reason"] == "shed_tier_shed"
        assert int(refused.headers["retry-after"]) >= 1
        assert ask(gateway, "critical work").status == 200  # standard, short: admitted
    finally:
        slogate(gateway, "drill", "--pool", "default", "--level", "0", "--minutes", "0")


def test_the_first_endpoint_refusing_sends_the_request_to_the_fallback(
    gateway: LocalStack,
) -> None:
    """Last in the module: it stops an engine. slogate still holds it serving (its probes
    are slow here); Envoy finds it refusing and tries the next endpoint named; the sidecar
    reads back who served."""
    first, second = engines(gateway)
    gateway.engine_procs["default"][0].stop()
    before = engine_rows(gateway)[second]["answered"]
    fallbacks = 0
    for index in range(12):
        reply = ask(gateway, f"after the stop {index}")
        assert reply.status == 200, reply.body
        assert reply.headers[SERVED_BY] == second
        if named(reply) == [first, second]:
            fallbacks += 1
    assert fallbacks > 0  # slogate named the stopped engine first for some of them
    # Every answer is counted for the engine that served (the fallback), not the first.
    assert wait_for(lambda: engine_rows(gateway)[second]["answered"] == before + 12)
    assert engine_rows(gateway)[first]["failed"] == 0
