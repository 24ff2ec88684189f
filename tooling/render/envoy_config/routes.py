"""The route table: pool routes picked by the sidecar's metadata, the forwarded paths, and
Envoy's own 404 for everything else (default deny)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 as ext_proc
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.envoy.type.v3 as envoy_type

from admission.crossing import crossing_pool
from admission.errors import error_document
from extproc.request.contract import (
    METADATA_NAMESPACE,
    POOL_FIELD,
    POOL_HEADER,
    POOL_ROUTE_PREFIX,
    REGION_HEADER,
    REGION_PING_PATH,
    RESPONSE_METADATA_HEADERS,
)
from policy._data_path import ExtProcMessages
from policy.apis import ErrorStyle
from policy.domain import FailureMode
from policy.schema import Policy
from tooling.render.envoy_config._common import _header
from tooling.render.envoy_config.engines import engine_retry
from tooling.render.envoy_config.one_message import (
    body_less_routes,
    per_route,
    processing_mode,
    upstream_headers_from_metadata,
)


def _shadow(
    policy: Policy, clusters: Mapping[str, str]
) -> list[route.RouteActionRequestMirrorPolicy]:
    """Routed inference requests, sampled, copied to the shadow pool; its answers are
    dropped by Envoy, so clients and budgets never see them."""
    if policy.shadow is None:
        return []
    per_million = round(policy.shadow.fraction * 1_000_000)
    return [
        route.RouteActionRequestMirrorPolicy(
            cluster=clusters.get(policy.shadow.pool, policy.shadow.pool),
            runtime_fraction=core.RuntimeFractionalPercent(
                default_value=envoy_type.FractionalPercent(
                    numerator=per_million,
                    denominator=envoy_type.FractionalPercentDenominatorType.MILLION,
                )
            ),
        )
    ]


def _rate_limit_headers() -> list[core.HeaderValueOption]:
    """OpenAI's rate-limit headers, filled from the sidecar's dynamic metadata.

    An empty value (no budget on this key) adds no header: keep_empty_value is false.
    """
    return [
        _header(name, f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{name})%")
        for name in RESPONSE_METADATA_HEADERS
    ]


def _path_match(path: str) -> route.RouteMatch:
    """Exactly this path, with or without one trailing slash. One regex per path: RE2's
    default program size limit (100) is too small for the list as one alternation."""
    return route.RouteMatch(safe_regex=matcher.RegexMatcher(regex=f"^{re.escape(path)}/?$"))


# A trailing slash names the same API; engines see the path without it (as the sidecar does).
_NO_TRAILING_SLASH = matcher.RegexMatchAndSubstitute(
    pattern=matcher.RegexMatcher(regex="^(.+)/$"), substitution="\\1"
)


def ext_proc_per_route(
    mode: FailureMode | None,
    disabled: bool = False,
    processing: ext_proc.ProcessingMode | None = None,
) -> dict[str, Any]:
    """A route's ext_proc settings: its failure mode (None: the policy-wide), disabled, or
    its own processing mode (one-message mode's body-less paths)."""
    allow = None if mode is None else mode is FailureMode.OPEN
    return per_route(allow, processing, disabled)


def failure_modes(policy: Policy) -> list[tuple[str, FailureMode | None]]:
    """Each forwarded path with the failure mode its longest matching `failure_mode_by_path`
    prefix gives it (None: the policy-wide mode)."""
    prefixes = sorted(policy.failure_mode_by_path, key=len, reverse=True)
    modes = []
    for path in policy.paths.forwarded_paths:
        prefix = next((p for p in prefixes if path.startswith(p)), None)
        modes.append((path, None if prefix is None else policy.failure_mode_by_path[prefix]))
    return modes


def _not_found(name: str, prefix: str, style: ErrorStyle) -> route.Route:
    """Default deny: a path no policy list names is answered here, never by an engine; the
    sidecar is not consulted (ext_proc is off on this route)."""
    body = error_document(
        style,
        404,
        "Unknown request URL: this gateway serves only the APIs its policy lists.",
        "invalid_request_error",
        "not_found",
    )
    return route.Route(
        name=name,
        match=route.RouteMatch(prefix=prefix),
        direct_response=route.DirectResponseAction(
            status=404, body=core.DataSource(inline_string=json.dumps(body))
        ),
        response_headers_to_add=[_header("content-type", "application/json")],
        **ext_proc_per_route(None, disabled=True),
    )


def _on_pool(pool: str) -> route.RouteMatch:
    """Any path of a request the sidecar put `pool` in dynamic metadata for."""
    return route.RouteMatch(
        prefix="/",
        dynamic_metadata=[
            matcher.MetadataMatcher(
                filter=METADATA_NAMESPACE,
                path=[matcher.MetadataMatcherPathSegment(key=POOL_FIELD)],
                value=matcher.ValueMatcher(string_match=matcher.StringMatcher(exact=pool)),
            )
        ],
    )


def pool_routes(policy: Policy, clusters: Mapping[str, str] | None = None) -> list[route.Route]:
    """One route per pool, matching the pool the sidecar put in dynamic metadata; the
    sidecar sets it only for requests on an enabled API that it admitted (clients can send
    any header, but cannot write metadata: only the sidecar picks a pool). `clusters`: the
    cluster each pool's engines are behind (absent: the cluster named as the pool)."""
    clusters = clusters or {}
    timeout = dt.timedelta(seconds=policy.upstream_timeout_s)
    # One message per request: the sidecar's upstream headers arrive as metadata.
    one = policy.data_path.messages is ExtProcMessages.ONE
    upstream = upstream_headers_from_metadata() if one else []
    return [
        route.Route(
            name=f"{POOL_ROUTE_PREFIX}{pool}",
            match=_on_pool(pool),
            route=route.RouteAction(
                cluster=clusters.get(pool, pool),
                timeout=timeout,
                request_mirror_policies=_shadow(policy, clusters),
                regex_rewrite=_NO_TRAILING_SLASH,
                retry_policy=engine_retry(),
            ),
            request_headers_to_add=upstream,
            response_headers_to_add=[_header(POOL_HEADER, pool), *_rate_limit_headers()],
        )
        for pool in policy.pools
    ]


def region_routes(policy: Policy) -> list[route.Route]:
    """One route per peer region with an ingress, matching the crossing pool the sidecar
    puts in metadata for a request it sends there (admission.crossing): to the peer's
    ingress (its Envoy), which decides it again. The response says which region served
    it; the rate-limit headers are the origin's, which charged it."""
    timeout = dt.timedelta(seconds=policy.upstream_timeout_s)
    one = policy.data_path.messages is ExtProcMessages.ONE
    upstream = upstream_headers_from_metadata() if one else []
    return [
        route.Route(
            name=f"{POOL_ROUTE_PREFIX}{crossing_pool(peer.name)}",
            match=_on_pool(crossing_pool(peer.name)),
            route=route.RouteAction(
                cluster=crossing_pool(peer.name),
                timeout=timeout,
                regex_rewrite=_NO_TRAILING_SLASH,
            ),
            request_headers_to_add=upstream,
            response_headers_to_add=[_header(REGION_HEADER, peer.name), *_rate_limit_headers()],
        )
        for peer in policy.regions.peers()
        if peer.ingress is not None and policy.regions.crossing.enabled
    ]


def region_ping_route() -> route.Route:
    """Answered by Envoy itself, ext_proc off: what peers' probes time (the round trip to
    this region's ingress, extproc.runtime.peer_probe)."""
    return route.Route(
        name="region_ping",
        match=route.RouteMatch(path=REGION_PING_PATH),
        direct_response=route.DirectResponseAction(
            status=200, body=core.DataSource(inline_string="ok")
        ),
        **ext_proc_per_route(None, disabled=True),
    )


def route_config(policy: Policy) -> route.RouteConfiguration:
    """Routes, in order:
    - one per pool (`pool_routes`), and one per peer region requests cross to
      (`region_routes`); where regions are on, the peers' probe path (`region_ping_route`);
    - one per forwarded path without a sidecar decision, to the default pool: public paths,
      and the first match of every API request (it carries the path's failure mode; when the
      sidecar answers, its decision re-routes the request to a pool route);
    - everything else: a 404 from Envoy itself (default deny).
    With one ext_proc message per request (`data_path.messages: one`), each inference path
    is preceded by its body-less routes and the other paths keep their header message
    (tooling.render.envoy_config.one_message).
    """
    timeout = dt.timedelta(seconds=policy.upstream_timeout_s)
    routes = pool_routes(policy) + region_routes(policy)
    if policy.regions.enabled:
        routes.append(region_ping_route())
    one = policy.data_path.messages is ExtProcMessages.ONE
    for path, mode in failure_modes(policy):
        match = _path_match(path)
        action = route.RouteAction(
            cluster=policy.default_pool, timeout=timeout, regex_rewrite=_NO_TRAILING_SLASH
        )
        processing = None
        if one:
            _, api = policy.paths.classify(path)
            if api is not None and api.reads_body:
                allow = None if mode is None else mode is FailureMode.OPEN
                routes += body_less_routes(path, api.methods, match, action, allow)
            else:
                # Public paths and APIs whose body is not read keep their header message.
                processing = processing_mode(headers=True, body=False)
        routes.append(
            route.Route(
                name=f"forwarded:{path}",
                match=match,
                route=action,
                response_headers_to_add=[_header(POOL_HEADER, policy.default_pool)],
                **ext_proc_per_route(mode, processing=processing),
            )
        )
    routes.append(_not_found("not_found:messages", "/v1/messages", ErrorStyle.ANTHROPIC))
    routes.append(_not_found("not_found", "/", ErrorStyle.OPENAI))
    return route.RouteConfiguration(
        name="slogate",
        virtual_hosts=[
            route.VirtualHost(
                name="inference",
                domains=["*"],
                routes=routes,
                # BUFFERED bodies up to the policy limit; a larger one gets Envoy's 413.
                request_body_buffer_limit=policy.max_body_bytes,
            )
        ],
    )
