"""What slogate adds to an Envoy it did not generate: the fragment, and its merge into a
static bootstrap.

What lives here: `build_fragment` (only slogate's pieces, typed like the bootstrap: HTTP
filters, clusters, the access log, the pool routes, the per-route ext_proc settings and the
connection manager's and virtual hosts' settings) and `merge_fragment`, which applies it to
a bootstrap written by someone else by the rules the contract states (docs/operators/):

- slogate's filters go just before each connection manager's router, in their order;
- its access log is appended to the manager's;
- its pool routes go first in every virtual host, routing to the operator's clusters;
- each of the operator's routes keeps ext_proc when it can serve a path the policy lists
  (with that path's failure mode when the policy gives one), and gets it disabled when it
  cannot (the sidecar would answer it with its default-deny 404);
- body buffer limits and the stream idle timeout are raised to the policy's, never lowered;
- its local-reply mappers run before the operator's.

A manager whose routes come from RDS (Istio, Envoy Gateway, any xDS control plane) cannot be
merged here: its control plane owns the routes (`slogate k8s --mesh` renders those).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm

from extproc.request.contract import ENVOY_PIECES, EXT_PROC_FILTER
from policy._data_path import ExtProcMessages
from policy.schema import Policy
from tooling.render.envoy_config.bootstrap import (
    manager_settings,
    pool_cluster,
    region_clusters,
    slogate_clusters,
)
from tooling.render.envoy_config.filters import access_logs, slogate_filters
from tooling.render.envoy_config.profile import SidecarTls
from tooling.render.envoy_config.routes import (
    ext_proc_per_route,
    failure_modes,
    pool_routes,
    region_routes,
)

HCM_TYPE = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
FRAGMENT_VERSION = 1


class MergeError(ValueError):
    """The bootstrap cannot take the fragment; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class FragmentTarget:
    """Where the fragment's pieces point in the operator's Envoy."""

    sidecar_host: str = "127.0.0.1"  # the sidecar's gRPC address (loopback: same pod)
    sidecar_port: int = 50051
    # pool -> the operator's cluster for its engines; a pool not named here gets a cluster
    # of its own name from the policy's endpoints.
    pool_clusters: Mapping[str, str] = field(default_factory=dict)
    sidecar_tls: SidecarTls | None = None  # None: plain text (the sidecar beside Envoy)
    sidecar_socket: str | None = None  # the sidecar's Unix socket instead of host:port


def build_fragment(policy: Policy, target: FragmentTarget | None = None) -> dict[str, Any]:
    """slogate's pieces of an Envoy configuration, camelCase like the bootstrap (keys are the
    Envoy fields each piece merges into)."""
    if policy.data_path.messages is not ExtProcMessages.TWO:
        # The one-message mode needs routes of its own on every inference path (the
        # body-less ones) beside an operator's: built for slogate's own bootstrap only.
        raise ValueError(
            "data_path.messages: one is supported only with slogate's own Envoy bootstrap "
            "(`slogate envoy-config`); a fragment for your Envoy or a mesh needs "
            "data_path.messages: two"
        )
    target = target or FragmentTarget()
    clusters = slogate_clusters(
        policy, target.sidecar_host, target.sidecar_port, target.sidecar_tls, target.sidecar_socket
    )
    clusters += [
        pool_cluster(pool, policy)
        for pool in policy.pools.values()
        if pool.name not in target.pool_clusters
    ]
    clusters += region_clusters(policy)
    by_path = [
        {"path": path, **_to_dict(ext_proc_per_route(mode))}
        for path, mode in failure_modes(policy)
        if mode is not None
    ]
    manager = hcm.HttpConnectionManager(
        http_filters=slogate_filters(policy), access_log=access_logs(), **manager_settings(policy)
    ).to_dict()
    return {
        "slogateFragment": FRAGMENT_VERSION,
        "policyFailureMode": policy.failure_mode.value,
        "httpFilters": manager.pop("httpFilters"),
        "accessLog": manager.pop("accessLog"),
        "httpConnectionManager": manager,
        "clusters": [c.to_dict() for c in clusters],
        "poolRoutes": [
            r.to_dict()
            for r in [*pool_routes(policy, target.pool_clusters), *region_routes(policy)]
        ],
        "routeSettings": {
            "forwardedPaths": sorted(policy.paths.forwarded_paths),
            "byPath": by_path,
            "elsewhere": _to_dict(ext_proc_per_route(None, disabled=True)),
        },
        "virtualHost": {"requestBodyBufferLimit": policy.max_body_bytes},
    }


def _to_dict(per_route: dict[str, Any]) -> dict[str, Any]:
    """`ext_proc_per_route`'s keyword arguments as a route's camelCase fields."""
    if not per_route:
        return {}
    typed = per_route["typed_per_filter_config"]
    return {
        "typedPerFilterConfig": route.Route(typed_per_filter_config=typed).to_dict()[
            "typedPerFilterConfig"
        ]
    }


def merge_fragment(
    bootstrap: dict[str, Any], fragment: dict[str, Any], listener: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """`bootstrap` (camelCase or snake_case, as Envoy reads either) with `fragment` applied
    to every HTTP connection manager of `listener` (None: of every static listener); and
    notes on what the operator should look at. Raises MergeError when it cannot apply."""
    merged = copy.deepcopy(bootstrap)
    static = _get(merged, "staticResources")
    if static is None:
        raise MergeError("the bootstrap has no static_resources: nothing to merge into")
    listeners = [
        item for item in _get(static, "listeners") or [] if listener in (None, item.get("name"))
    ]
    if not listeners:
        raise MergeError(f"no static listener named {listener!r}" if listener else "no listeners")
    notes: list[str] = []
    managers = [m for item in listeners for m in _managers(item)]
    if not managers:
        raise MergeError("no HTTP connection manager in the listeners: nothing to merge into")
    snake_file = "static_resources" in merged  # new fields spelled as the file spells
    for manager in managers:
        notes += _merge_manager(manager, fragment, snake_file)
    clusters = _get(static, "clusters")
    if clusters is None:
        clusters = static[_key(static, "clusters", snake_file)] = []
    names = {c.get("name") for c in clusters}
    for cluster in fragment["clusters"]:
        if cluster["name"] in names:
            raise MergeError(
                f"the bootstrap already has a cluster named {cluster['name']!r}: map the pool "
                "to it with --pool-cluster POOL=CLUSTER, or rename one of them"
            )
        clusters.append(copy.deepcopy(cluster))
    wanted = {r["route"]["cluster"] for r in fragment["poolRoutes"]}
    missing = sorted(wanted - {c.get("name") for c in clusters})
    if missing:
        raise MergeError(f"the pool routes send to clusters the bootstrap lacks: {missing}")
    return merged, notes


def _snake_name(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


def _get(mapping: Mapping[str, Any], camel: str) -> Any:
    """A field by its camelCase or snake_case name."""
    if camel in mapping:
        return mapping[camel]
    return mapping.get(_snake_name(camel))


def _key(mapping: Mapping[str, Any], camel: str, snake_file: bool) -> str:
    """The spelling `mapping` already uses for a field; for a new one, the file's."""
    snake = _snake_name(camel)
    if camel in mapping:
        return camel
    return snake if snake in mapping or snake_file else camel


def _managers(listener: Mapping[str, Any]) -> list[dict[str, Any]]:
    chains = list(_get(listener, "filterChains") or [])
    default = _get(listener, "defaultFilterChain")
    if default:
        chains.append(default)
    found = []
    for chain in chains:
        for item in chain.get("filters") or []:
            typed = _get(item, "typedConfig") or {}
            if typed.get("@type") == HCM_TYPE:
                found.append(typed)
    return found


def _merge_manager(
    manager: dict[str, Any], fragment: Mapping[str, Any], snake_file: bool
) -> list[str]:
    filters = manager.setdefault(_key(manager, "httpFilters", snake_file), [])
    if EXT_PROC_FILTER in {f.get("name") for f in filters}:
        raise MergeError(f"this manager already has {EXT_PROC_FILTER}: merged before?")
    routers = [
        i
        for i, f in enumerate(filters)
        if (_get(f, "typedConfig") or {}).get("@type") == ROUTER_TYPE
    ]
    if not routers:
        raise MergeError("an HTTP connection manager without a router filter")
    at = routers[0]
    filters[at:at] = copy.deepcopy(fragment["httpFilters"])
    logs = manager.setdefault(_key(manager, "accessLog", snake_file), [])
    logs += copy.deepcopy(fragment["accessLog"])
    notes = _merge_settings(manager, fragment["httpConnectionManager"], snake_file)
    config = _get(manager, "routeConfig")
    if config is None:
        raise MergeError(
            "this manager's routes come from RDS: its control plane owns them; add the "
            "fragment's poolRoutes and routeSettings there (slogate k8s --mesh for Istio and "
            "Envoy Gateway)"
        )
    for vhost in _get(config, "virtualHosts") or []:
        notes += _merge_virtual_host(vhost, fragment, snake_file)
    return notes


def _seconds(value: Any) -> float:
    """An Envoy duration ("300s", "1.5s") in seconds."""
    text = str(value)
    return float(text[:-1]) if text.endswith("s") else float(text)


def _merge_settings(
    manager: dict[str, Any], ours: Mapping[str, Any], snake_file: bool
) -> list[str]:
    notes = []
    idle_key = _key(manager, "streamIdleTimeout", snake_file)
    wanted = _seconds(ours["streamIdleTimeout"])
    if idle_key not in manager or _seconds(manager[idle_key]) < wanted:  # never lowered
        if idle_key in manager:
            notes.append(
                f"stream_idle_timeout raised from {manager[idle_key]} to "
                f"{ours['streamIdleTimeout']} (the waiting room holds requests that long)"
            )
        manager[idle_key] = ours["streamIdleTimeout"]
    for camel in ("normalizePath", "mergeSlashes", "pathWithEscapedSlashesAction"):
        key = _key(manager, camel, snake_file)
        if key in manager and manager[key] != ours[camel]:
            notes.append(
                f"{camel} set to {ours[camel]} (was {manager[key]}): the sidecar classifies "
                "the path the engines act on"
            )
        manager[key] = ours[camel]
    replies_key = _key(manager, "localReplyConfig", snake_file)
    replies = manager.setdefault(replies_key, {})
    mappers_key = _key(replies, "mappers", snake_file)
    replies[mappers_key] = [
        *copy.deepcopy(ours["localReplyConfig"]["mappers"]),
        *(replies.get(mappers_key) or []),
    ]
    return notes


def _merge_virtual_host(
    vhost: dict[str, Any], fragment: Mapping[str, Any], snake_file: bool
) -> list[str]:
    notes = []
    routes_key = _key(vhost, "routes", snake_file)
    theirs = vhost.get(routes_key) or []
    settings = fragment["routeSettings"]
    forwarded: list[str] = settings["forwardedPaths"]
    modes = {entry["path"]: entry["typedPerFilterConfig"] for entry in settings["byPath"]}
    for item in theirs:
        served = _served_paths(_get(item, "match") or {}, forwarded)
        per_filter_key = _key(item, "typedPerFilterConfig", snake_file)
        per_filter = item.setdefault(per_filter_key, {})
        if not served:
            per_filter.update(copy.deepcopy(settings["elsewhere"]["typedPerFilterConfig"]))
            continue
        chosen = {repr(modes.get(path)) for path in served}
        if len(chosen) > 1:
            notes.append(
                f"route {item.get('name', '(unnamed)')!r} serves paths with different "
                f"failure modes ({', '.join(sorted(served))}): it keeps the policy-wide "
                f"one ({fragment['policyFailureMode']}); split it to set them per path"
            )
            continue
        mode = modes.get(served[0])
        if mode is not None:
            per_filter.update(copy.deepcopy(mode))
    vhost[routes_key] = [*copy.deepcopy(fragment["poolRoutes"]), *theirs]
    limit_key = _key(vhost, "requestBodyBufferLimit", snake_file)
    wanted = int(fragment["virtualHost"]["requestBodyBufferLimit"])
    if int(vhost.get(limit_key) or 0) < wanted:
        vhost[limit_key] = wanted
    return notes


def _served_paths(match: Mapping[str, Any], forwarded: list[str]) -> list[str]:
    """The policy's forwarded paths a route match can take (with or without one trailing
    slash). A match this cannot read (headers only, a CONNECT matcher, a path template)
    is taken to serve them all: ext_proc stays on, the safe side."""
    candidates = [(path, (path, f"{path}/")) for path in forwarded]
    if (prefix := _get(match, "prefix")) is not None:
        return [p for p, forms in candidates if any(f.startswith(prefix) for f in forms)]
    if (exact := _get(match, "path")) is not None:
        return [p for p, forms in candidates if exact in forms]
    if (separated := _get(match, "pathSeparatedPrefix")) is not None:
        return [p for p, _ in candidates if p == separated or p.startswith(f"{separated}/")]
    regex = _get(match, "safeRegex")
    if regex is not None and "regex" in regex:
        pattern = re.compile(regex["regex"])
        return [p for p, forms in candidates if any(pattern.fullmatch(f) for f in forms)]
    return list(forwarded)


def contract_table() -> str:
    """ENVOY_PIECES as the docs' markdown table (docs/operators/deploy-envoy.md)."""
    lines = [
        "| piece | where | what slogate needs | without it |",
        "|---|---|---|---|",
    ]
    for piece in ENVOY_PIECES:
        cells = (piece.piece, piece.where, piece.what, piece.if_missing)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
