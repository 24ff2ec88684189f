"""The Envoy pieces of crossing regions: a cluster and a route per peer region with an
ingress, picked by the sidecar's metadata like the pools; Envoy's own ping path for the
peers' probes. A real Envoy runs them in tests/e2e/test_crossing.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from extproc.request.contract import CROSSED_HEADER, EXT_PROC_FILTER, REGION_PING_PATH
from policy._data_path import ExtProcMessages
from policy.loader import parse_policy
from policy.start_only import start_only_changes
from tests.support.envoy_config import bootstrap_manager
from tests.support.messages import with_messages
from tests.support.stack import example_policy, write_policy
from tooling.cli.main import main
from tooling.render.envoy_config.bootstrap import build_bootstrap
from tooling.render.envoy_config.fragment import build_fragment


def regions(crossing: bool = True, messages: ExtProcMessages = ExtProcMessages.TWO) -> Any:
    raw = example_policy()
    raw["regions"] = {
        "this": "eu",
        "list": {
            "eu": {"ingress": "10.0.1.10:10000"},
            "us": {"ingress": "10.0.2.10:10000"},
            "ap": {},  # takes no crossing traffic
        },
        "ledger": {"url": "redis://global:6379/0"},
        "crossing": {"enabled": crossing, "secret_file": "/etc/slogate/regions.key"},
    }
    return parse_policy(with_messages(raw, messages))


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = bootstrap_manager(config)["routeConfig"]["virtualHosts"][0][
        "routes"
    ]
    return routes


def test_each_peer_with_an_ingress_gets_a_cluster_and_a_metadata_route() -> None:
    config = build_bootstrap(regions())
    clusters = {c["name"]: c for c in config["staticResources"]["clusters"]}
    assert "region:eu" not in clusters and "region:ap" not in clusters
    address = clusters["region:us"]["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]
    socket = address["endpoint"]["address"]["socketAddress"]
    assert (socket["address"], socket["portValue"]) == ("10.0.2.10", 10000)
    by_name = {r["name"]: r for r in routes(config)}
    crossing = by_name["slogate_pool_region:us"]
    assert crossing["route"]["cluster"] == "region:us"
    (matched,) = crossing["match"]["dynamicMetadata"]  # never a client's header
    assert matched["value"]["stringMatch"]["exact"] == "region:us"
    added = {h["header"]["key"]: h["header"]["value"] for h in crossing["responseHeadersToAdd"]}
    assert added["x-slogate-region"] == "us"
    assert "requestHeadersToAdd" not in crossing  # the header reply sets the token


def test_envoy_answers_the_peers_probe_itself_before_any_forwarded_path() -> None:
    names = [r["name"] for r in routes(build_bootstrap(regions()))]
    ping = routes(build_bootstrap(regions()))[names.index("region_ping")]
    assert ping["match"]["path"] == REGION_PING_PATH
    assert int(ping["directResponse"]["status"]) == 200
    assert ping["typedPerFilterConfig"][EXT_PROC_FILTER]["disabled"] is True
    assert names.index("region_ping") < min(
        i for i, n in enumerate(names) if n.startswith("forwarded:")
    )


def test_with_one_message_the_token_travels_in_metadata() -> None:
    config = build_bootstrap(regions(messages=ExtProcMessages.ONE))
    crossing = {r["name"]: r for r in routes(config)}["slogate_pool_region:us"]
    added = {h["header"]["key"]: h["header"]["value"] for h in crossing["requestHeadersToAdd"]}
    assert added[CROSSED_HEADER] == f"%DYNAMIC_METADATA(slogate:{CROSSED_HEADER})%"


@pytest.mark.parametrize("crossing", [False, None])
def test_without_crossing_nothing_is_rendered_for_the_peers(crossing: bool | None) -> None:
    policy = regions(crossing=False) if crossing is False else parse_policy(example_policy())
    config = build_bootstrap(policy)
    assert not [c for c in config["staticResources"]["clusters"] if c["name"].startswith("region")]
    names = [r["name"] for r in routes(config)]
    assert not [n for n in names if "region:" in n]
    assert ("region_ping" in names) is (crossing is False)  # regions on: still probed


def test_the_fragment_carries_the_peers_too() -> None:
    fragment = build_fragment(regions())
    assert "region:us" in {c["name"] for c in fragment["clusters"]}
    assert "slogate_pool_region:us" in {r["name"] for r in fragment["poolRoutes"]}


def test_a_reload_cannot_turn_crossing_on_or_change_its_secret() -> None:
    """Envoy has routes to the peers only where crossing was on when it was rendered, and
    the secret is read at start: refused, as data_path is. The peers listed may change (a
    new one is crossed to after a restart: admission.crossing.Crossing's routable)."""
    assert start_only_changes(regions(), regions(crossing=False)) == ["regions.crossing.enabled"]
    moved = regions()
    moved = dataclasses.replace(moved, regions=dataclasses.replace(moved.regions, regions={}))
    assert start_only_changes(regions(), moved) == []


def test_envoy_config_renders_another_regions_peers_with_region(tmp_path: Path) -> None:
    """One policy for every region, as `serve --region`: the Envoy of `us` routes to `eu`."""
    raw = example_policy()
    raw["regions"] = {
        "this": "eu",
        "list": {"eu": {"ingress": "10.0.1.10:10000"}, "us": {"ingress": "10.0.2.10:10000"}},
        "ledger": {"url": "redis://global:6379/0"},
        "crossing": {"enabled": True, "secret_file": "/etc/slogate/regions.key"},
    }
    policy = write_policy(tmp_path / "policy.yaml", raw)
    out = tmp_path / "bootstrap.json"
    assert main(["envoy-config", "--policy", str(policy), "--region", "us", "--out", str(out)]) == 0
    clusters = {c["name"] for c in json.loads(out.read_text())["staticResources"]["clusters"]}
    assert "region:eu" in clusters and "region:us" not in clusters
    assert main(["envoy-config", "--policy", str(policy), "--region", "mars"]) == 2
