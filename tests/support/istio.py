"""What istiod does with an EnvoyFilter's patches, for the operations slogate's uses, on an
Envoy configuration shaped as Istio generates one for an ingress gateway -- so the result
can be run by the real Envoy here. Istio itself cannot run on this machine.

The semantics follow Istio's envoyfilter package (pilot/pkg/networking/core/envoyfilter):
HTTP_FILTER INSERT_BEFORE lands just before the named sub-filter; NETWORK_FILTER and
VIRTUAL_HOST MERGE are protobuf merges (messages merged field by field, repeated fields
appended, scalars replaced); HTTP_ROUTE INSERT_FIRST prepends to every virtual host of the
matched route configuration; HTTP_ROUTE MERGE with a route name merges into that route.
Listeners are matched by the port in their name (`0.0.0.0_8080`), route configurations by
the port in theirs (`http.8080`), as istiod names them.
"""

from __future__ import annotations

import copy
from typing import Any

from tooling.render.envoy_config.fragment import HCM_TYPE, ROUTER_TYPE


def cluster(name: str, port: int, http2: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "connectTimeout": "1s",
        "loadAssignment": {
            "clusterName": name,
            "endpoints": [
                {
                    "lbEndpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socketAddress": {"address": "127.0.0.1", "portValue": port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if http2:  # what istiod makes for a Service port with appProtocol grpc
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        config["typedExtensionProtocolOptions"] = {
            options: {
                "@type": f"type.googleapis.com/{options}",
                "explicitHttpConfig": {"http2ProtocolOptions": {}},
            }
        }
    return config


def gateway_bootstrap(
    listen_port: int,
    admin_port: int,
    gateway_port: int,
    clusters: dict[str, tuple[int, bool]],
    default_cluster: str,
) -> dict[str, Any]:
    """An ingress gateway's configuration as istiod would push it for a Gateway on
    `gateway_port` and a VirtualService sending `/v1/` and `/health` to the default pool,
    with a status route answered by Envoy; the route configuration inline where istiod
    would send it by RDS."""
    routes = [
        {
            "name": "status",
            "match": {"path": "/status"},
            "directResponse": {"status": 200, "body": {"inlineString": "ok"}},
        },
        {"name": "inference", "match": {"prefix": "/v1/"}, "route": {"cluster": default_cluster}},
        {"name": "health", "match": {"path": "/health"}, "route": {"cluster": default_cluster}},
    ]
    manager = {
        "@type": HCM_TYPE,
        "statPrefix": f"outbound_0.0.0.0_{gateway_port}",
        "httpFilters": [
            {"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER_TYPE}}
        ],
        "routeConfig": {
            "name": f"http.{gateway_port}",
            "virtualHosts": [{"name": "*:80", "domains": ["*"], "routes": routes}],
        },
    }
    return {
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": admin_port}}},
        "staticResources": {
            "listeners": [
                {
                    "name": f"0.0.0.0_{gateway_port}",
                    "address": {
                        "socketAddress": {"address": "127.0.0.1", "portValue": listen_port}
                    },
                    "filterChains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typedConfig": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [cluster(name, port, http2) for name, (port, http2) in clusters.items()],
        },
    }


def merge(into: dict[str, Any], value: dict[str, Any]) -> None:
    """A protobuf merge on the JSON forms: messages field by field, lists appended."""
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(into.get(key), dict):
            merge(into[key], item)
        elif isinstance(item, list) and isinstance(into.get(key), list):
            into[key].extend(copy.deepcopy(item))
        else:
            into[key] = copy.deepcopy(item)


def apply_envoy_filter(bootstrap: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(bootstrap)
    listeners = config["staticResources"]["listeners"]
    for patch in spec["configPatches"]:
        kind, operation = patch["applyTo"], patch["patch"]["operation"]
        value, match = patch["patch"]["value"], patch["match"]
        if kind in ("HTTP_FILTER", "NETWORK_FILTER"):
            port = match["listener"]["portNumber"]
            for listener in listeners:
                if listener["name"] != f"0.0.0.0_{port}":
                    continue
                for manager in _managers(listener):
                    if kind == "HTTP_FILTER" and operation == "INSERT_BEFORE":
                        sub = match["listener"]["filterChain"]["filter"]["subFilter"]["name"]
                        filters = manager["httpFilters"]
                        at = next(i for i, f in enumerate(filters) if f["name"] == sub)
                        filters.insert(at, copy.deepcopy(value))
                    elif kind == "NETWORK_FILTER" and operation == "MERGE":
                        merge(manager, value["typedConfig"])
                    else:
                        raise NotImplementedError((kind, operation))
            continue
        if kind == "CLUSTER":
            if operation != "MERGE":
                raise NotImplementedError((kind, operation))
            clusters = config["staticResources"]["clusters"]
            named = [c for c in clusters if c["name"] == match["cluster"]["name"]]
            assert named, f"no cluster {match['cluster']['name']} to patch"
            for found in named:
                merge(found, value)
            continue
        port = match["routeConfiguration"]["portNumber"]
        wanted = match["routeConfiguration"].get("vhost", {}).get("route", {}).get("name")
        for listener in listeners:
            for manager in _managers(listener):
                routes_config = manager["routeConfig"]
                if routes_config["name"] != f"http.{port}":
                    continue
                for vhost in routes_config["virtualHosts"]:
                    if kind == "HTTP_ROUTE" and operation == "INSERT_FIRST":
                        vhost["routes"].insert(0, copy.deepcopy(value))
                    elif kind == "HTTP_ROUTE" and operation == "MERGE":
                        for route in vhost["routes"]:
                            if wanted is None or route.get("name") == wanted:
                                merge(route, value)
                    elif kind == "VIRTUAL_HOST" and operation == "MERGE":
                        merge(vhost, value)
                    else:
                        raise NotImplementedError((kind, operation))
    return config


def _managers(listener: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        f["typedConfig"]
        for chain in listener["filterChains"]
        for f in chain["filters"]
        if f["typedConfig"]["@type"] == HCM_TYPE
    ]
