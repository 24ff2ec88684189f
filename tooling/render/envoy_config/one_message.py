"""One ext_proc message per request (policy `data_path.messages: one`): the Envoy pieces that
let the sidecar decide on the buffered body alone (ENVOY-NOTES, "One ext_proc message per
request").

What lives here: the filter that forwards the request headers the sidecar reads as metadata,
the filter that holds the request until the body's reply, what the pool routes add upstream
from the sidecar's metadata, and the per-route settings that keep every body-less request
guarded. The routes and filters modules call these only in that mode; the two-message
configuration does not change.

The two holes a skipped header phase opens, and how they are closed:
- A request without a body never reaches the processor. On an inference path, a declared
  empty body (`content-length: 0`) with the API's method is refused by Envoy itself (400,
  the API's error shape); with another method, or with no declared length, the request gets
  the two-message processing on its route, so the sidecar sees its headers as in the
  default mode (no body: 401 / 405 / 400 `missing_body` as there; a body: decided as
  there). A request without a declared length may have a body: HTTP/1.1 chunked (Envoy
  1.40 removes `transfer-encoding` before routing: a chunked request matched a route that
  requires the header absent, so routes cannot tell it from a body-less one), or HTTP/2
  without content-length. Clients that declare their length get one message.
  Other forwarded paths (public, APIs whose body is not read) keep their header message
  through a per-route processing mode, so they are guarded as in the default mode.
- The body reply's header mutations are dropped: routing goes by dynamic metadata as in both
  modes, and the upstream `x-slogate-*` headers come from the pool route's
  request_headers_to_add, rendered from the metadata the sidecar sets.
"""

from __future__ import annotations

import json
import re
from typing import Any

import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.filters.http.buffer.v3 as buffer
import envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 as ext_proc
import envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 as to_metadata
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.google.protobuf as pb

from admission.errors import error_document
from extproc.request.contract import (
    EXT_PROC_FILTER,
    FORWARDED_HEADERS,
    FORWARDED_NAMESPACE,
    METADATA_NAMESPACE,
    REASON_HEADER,
    UPSTREAM_METADATA_HEADERS,
)
from policy.apis import error_style_for
from policy.schema import Policy
from tooling.render.envoy_config._common import _header, _typed

FORWARD_FILTER = "slogate.forward_headers"
HOLD_FILTER = "slogate.hold_request"
MISSING_BODY_REASON = "missing_body"  # the sidecar's reason for the same refusal

_SEND = ext_proc.ProcessingModeHeaderSendMode.SEND
_SKIP = ext_proc.ProcessingModeHeaderSendMode.SKIP


def forward_headers_filter() -> hcm.HttpFilter:
    """Before ext_proc: the headers the sidecar decides on, as metadata ext_proc forwards
    (an absent header writes nothing; the sidecar reads it as absent)."""
    config = to_metadata.Config(
        request_rules=[
            to_metadata.ConfigRule(
                header=name,
                on_header_present=to_metadata.ConfigKeyValuePair(
                    metadata_namespace=FORWARDED_NAMESPACE,
                    key=name,
                    type=to_metadata.ConfigValueType.STRING,
                ),
                remove=False,
            )
            for name in FORWARDED_HEADERS
        ]
    )
    return hcm.HttpFilter(**_typed(FORWARD_FILTER, config))


def hold_filter(policy: Policy) -> hcm.HttpFilter:
    """After ext_proc: with the header phase skipped, nothing else keeps the router from
    sending the headers upstream, on the route chosen before the decision, while the body
    is being decided. Its limit is the policy's body limit (413 past it, as the buffer)."""
    config = buffer.Buffer(max_request_bytes=policy.max_body_bytes)
    return hcm.HttpFilter(**_typed(HOLD_FILTER, config))


def processing_mode(headers: bool, body: bool) -> ext_proc.ProcessingMode:
    """The filter's processing mode with the request headers sent or skipped and the
    request body buffered or not; responses never go to the sidecar."""
    body_mode = (
        ext_proc.ProcessingModeBodySendMode.BUFFERED
        if body
        else ext_proc.ProcessingModeBodySendMode.NONE
    )
    return ext_proc.ProcessingMode(
        request_header_mode=_SEND if headers else _SKIP,
        response_header_mode=_SKIP,
        request_body_mode=body_mode,
        response_body_mode=ext_proc.ProcessingModeBodySendMode.NONE,
        request_trailer_mode=_SKIP,
        response_trailer_mode=_SKIP,
    )


def upstream_headers_from_metadata() -> list[core.HeaderValueOption]:
    """What a pool route tells the pool: each header the sidecar put in its metadata,
    overwriting a client's copy (a header whose metadata is absent is not touched: the
    header phase set it, or the request is not the sidecar's)."""
    return [
        _header(name, f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{name})%")
        for name in UPSTREAM_METADATA_HEADERS
    ]


def _header_matcher(name: str, *, exact: str | None = None) -> route.HeaderMatcher:
    if exact is not None:
        return route.HeaderMatcher(name=name, string_match=matcher.StringMatcher(exact=exact))
    return route.HeaderMatcher(name=name, present_match=True, invert_match=True)


def body_less_routes(
    path: str,
    methods: frozenset[str],
    match: route.RouteMatch,
    action: route.RouteAction,
    failure_allow: bool | None,
) -> list[route.Route]:
    """The routes before an inference path's own (`match`, `action`: that route's): a
    declared empty body with one of the API's `methods` is Envoy's 400; any other
    body-less request (an empty body with another method, or no declared length) is
    processed in two messages, so the sidecar answers it as in the default mode (401
    before 405). `failure_allow`: the path's failure mode (None: the filter's)."""
    document = error_document(
        error_style_for(path), 400, "The request has no body.", "invalid_request_error", None
    )
    allowed = "|".join(re.escape(m) for m in sorted(methods))
    empty = route.Route(
        name=f"empty_body:{path}",
        match=route.RouteMatch(
            safe_regex=match.safe_regex,
            headers=[
                _header_matcher("content-length", exact="0"),
                route.HeaderMatcher(
                    name=":method",
                    string_match=matcher.StringMatcher(
                        safe_regex=matcher.RegexMatcher(regex=f"^({allowed})$")
                    ),
                ),
            ],
        ),
        direct_response=route.DirectResponseAction(
            status=400, body=core.DataSource(inline_string=json.dumps(document))
        ),
        response_headers_to_add=[
            _header("content-type", "application/json"),
            _header(REASON_HEADER, MISSING_BODY_REASON),
        ],
        **per_route(disabled=True),
    )
    headers_first = per_route(failure_allow, processing_mode(headers=True, body=True))
    return [
        empty,
        *(
            route.Route(
                name=f"{name}:{path}",
                match=route.RouteMatch(safe_regex=match.safe_regex, headers=[length]),
                route=action,
                **headers_first,
            )
            for name, length in (
                ("empty_body_other_method", _header_matcher("content-length", exact="0")),
                ("undeclared_length", _header_matcher("content-length")),
            )
        ),
    ]


def per_route(
    failure_allow: bool | None = None,
    mode: ext_proc.ProcessingMode | None = None,
    disabled: bool = False,
) -> dict[str, Any]:
    """A route's ext_proc settings as Route keyword arguments (none: the filter's)."""
    if disabled:
        config = ext_proc.ExtProcPerRoute(disabled=True)
    elif failure_allow is None and mode is None:
        return {}
    else:
        config = ext_proc.ExtProcPerRoute(
            overrides=ext_proc.ExtProcOverrides(
                processing_mode=mode, failure_mode_allow=failure_allow
            )
        )
    return {"typed_per_filter_config": {EXT_PROC_FILTER: pb.Any.pack(config)}}
