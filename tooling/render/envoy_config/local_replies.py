"""Envoy's own errors as JSON in the error shape of the API the client called."""

from __future__ import annotations

import envoy_data_plane.envoy.config.accesslog.v3 as accesslog
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.google.protobuf as pb

from admission.errors import error_document
from extproc.request.contract import (
    JWT_AUTHN_NAMESPACE,
    SIDECAR_FAILURE_STATUS,
)
from policy.apis import ErrorStyle
from tooling.render.envoy_config.filters import JWT_FAILURE_KEY


def _status_filter(status: int) -> accesslog.AccessLogFilter:
    return accesslog.AccessLogFilter(
        status_code_filter=accesslog.StatusCodeFilter(
            comparison=accesslog.ComparisonFilter(
                op=accesslog.ComparisonFilterOp.EQ,
                value=core.RuntimeUInt32(default_value=status, runtime_key="-"),
            )
        )
    )


def _json_error_mapper(
    match: accesslog.AccessLogFilter,
    status: int,
    message: str,
    error_type: str,
    code: str,
    style: ErrorStyle,
) -> hcm.ResponseMapper:
    if style is ErrorStyle.ANTHROPIC:
        # Anthropic's clients call /v1/messages; they get Anthropic's error shape.
        on_messages = accesslog.AccessLogFilter(
            header_filter=accesslog.HeaderFilter(
                header=route.HeaderMatcher(
                    name=":path", string_match=matcher.StringMatcher(prefix="/v1/messages")
                )
            )
        )
        match = accesslog.AccessLogFilter(
            and_filter=accesslog.AndFilter(filters=[on_messages, match])
        )
    return hcm.ResponseMapper(
        filter=match,
        body_format_override=core.SubstitutionFormatString(
            json_format=pb.Struct.from_dict(
                error_document(style, status, message, error_type, code)
            ),
            content_type="application/json",
        ),
    )


def local_reply_config() -> hcm.LocalReplyConfig:
    """Envoy's own errors as JSON in the API's error shape (Anthropic's on /v1/messages,
    OpenAI's elsewhere).

    Mappers apply to every local reply, the sidecar's ImmediateResponses included, so they
    match only what the sidecar never sends: 502 (the sidecar failed: ext_proc's
    status_on_error), 504 (timeouts: a hung sidecar past message_timeout_ms, or a slow
    upstream), upstream-unavailable response flags, and 413 (which both say the same thing).
    The sidecar's own 503 (breaker) keeps its body.
    """
    upstream_down = accesslog.AccessLogFilter(
        response_flag_filter=accesslog.ResponseFlagFilter(
            flags=["UH", "UF", "UO", "NR", "URX", "UC"]
        )
    )
    jwt_failed = accesslog.AccessLogFilter(
        metadata_filter=accesslog.MetadataFilter(
            matcher=matcher.MetadataMatcher(
                filter=JWT_AUTHN_NAMESPACE,
                path=[matcher.MetadataMatcherPathSegment(key=JWT_FAILURE_KEY)],
                value=matcher.ValueMatcher(present_match=True),
            ),
            match_if_key_not_found=False,
        )
    )
    mappers = []
    for style in (ErrorStyle.ANTHROPIC, ErrorStyle.OPENAI):
        token_mapper = _json_error_mapper(
            jwt_failed,
            401,
            "Invalid or missing bearer token: "
            f"%DYNAMIC_METADATA({JWT_AUTHN_NAMESPACE}:{JWT_FAILURE_KEY}:message)%",
            "invalid_request_error",
            "invalid_api_key",
            style,
        )
        # jwt_authn answers some failures (audience, issuer) with 403; to a client each of
        # them is the same thing: the token does not let it in.
        token_mapper.status_code = 401
        mappers += [
            token_mapper,
            _json_error_mapper(
                _status_filter(413),
                413,
                "Request body is larger than the limit this gateway accepts.",
                "invalid_request_error",
                "request_too_large",
                style,
            ),
            _json_error_mapper(
                _status_filter(SIDECAR_FAILURE_STATUS),
                SIDECAR_FAILURE_STATUS,
                "The inference gateway is temporarily unavailable: %RESPONSE_CODE_DETAILS%",
                "server_error",
                "gateway_unavailable",
                style,
            ),
            _json_error_mapper(
                _status_filter(504),
                504,
                "The inference gateway timed out: %RESPONSE_CODE_DETAILS%",
                "server_error",
                "gateway_timeout",
                style,
            ),
            _json_error_mapper(
                upstream_down,
                503,
                "No inference server is available for this request: %RESPONSE_CODE_DETAILS%",
                "server_error",
                "upstream_unavailable",
                style,
            ),
        ]
    return hcm.LocalReplyConfig(mappers=mappers)
