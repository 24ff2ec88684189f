"""The Envoy bootstrap, generated from the policy with typed Envoy API objects.

What lives here: one function per piece of the bootstrap (listener, filters, routes, clusters,
access log) and `build_bootstrap`, which assembles them into the camelCase dict Envoy
accepts. Nothing here starts Envoy; tests validate the output with `envoy --mode validate`.

The shape, and why:
- ext_proc sees request headers and the BUFFERED body only. Its body reply carries the route
  header plus `clear_route_cache`, so the route is picked on the body (prompt + max_tokens).
  Responses never go to Python: the Lua usage tap reads usage out of the (streamed) body
  in-proxy, and one gRPC access-log entry per request carries usage and timings to the
  sidecar, batched.
- Each pool is a cluster of the same name; the route for a pool adds `x-slogate-pool` to
  the response, so clients see which pool served them without an extra round trip.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

import envoy_data_plane.envoy.config.accesslog.v3 as accesslog
import envoy_data_plane.envoy.config.bootstrap.v3 as bootstrap
import envoy_data_plane.envoy.config.cluster.v3 as cluster
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.endpoint.v3 as endpoint
import envoy_data_plane.envoy.config.listener.v3 as listener
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.access_loggers.grpc.v3 as grpc_log
import envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 as ext_proc
import envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 as jwt_authn
import envoy_data_plane.envoy.extensions.filters.http.lua.v3 as lua
import envoy_data_plane.envoy.extensions.filters.http.router.v3 as router
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 as tls
import envoy_data_plane.envoy.extensions.upstreams.http.v3 as upstream_http
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.envoy.type.tracing.v3 as tracing
import envoy_data_plane.envoy.type.v3 as envoy_type
import envoy_data_plane.google.protobuf as pb

from admission.errors import error_document
from extproc.request.contract import (
    ACCESS_LOG_NAME,
    ACCESS_LOG_TAGS,
    JWT_AUTHN_NAMESPACE,
    JWT_PAYLOAD_KEY,
    METADATA_NAMESPACE,
    POOL_FIELD,
    POOL_HEADER,
    RATE_LIMIT_HEADERS,
)
from policy import FailureMode, Policy
from policy.apis import ErrorStyle

SIDECAR_CLUSTER = "slogate_sidecar"
SIDECAR_FAILURE_STATUS = 502  # what clients get when fail-closed and the sidecar fails


class FilterProfile(StrEnum):
    """Which filters the listener runs; only benchmarks use anything but SLOGATE."""

    SLOGATE = "slogate"  # ext_proc + usage tap + access log to the sidecar
    EXT_PROC_ONLY = "ext_proc_only"  # the same ext_proc filter and modes, nothing else
    PLAIN = "plain"  # Envoy alone: router only


@dataclass(frozen=True, slots=True)
class EnvoyPorts:
    listen_port: int = 10000
    admin_port: int = 9901
    sidecar_port: int = 50051
    host: str = "127.0.0.1"  # the sidecar and the admin interface: loopback only
    listen_host: str | None = None  # the client listener; None: `host` (0.0.0.0 in a pod)


def usage_tap_lua() -> str:
    return resources.files("extproc").joinpath("usage_tap.lua").read_text(encoding="utf-8")


def _duration_ms(ms: float) -> dt.timedelta:
    return dt.timedelta(milliseconds=ms)


def _typed(name: str, message: Any) -> dict[str, Any]:
    return {"name": name, "typed_config": pb.Any.pack(message)}


def _header(key: str, value: str) -> core.HeaderValueOption:
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, value=value),
        append_action=core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _address(host: str, port: int) -> core.Address:
    return core.Address(socket_address=core.SocketAddress(address=host, port_value=port))


def ext_proc_filter(policy: Policy, failure_mode_allow: bool | None = None) -> hcm.HttpFilter:
    allow = (
        policy.failure_mode is FailureMode.OPEN
        if failure_mode_allow is None
        else failure_mode_allow
    )
    config = ext_proc.ExternalProcessor(
        grpc_service=core.GrpcService(
            envoy_grpc=core.GrpcServiceEnvoyGrpc(
                cluster_name=SIDECAR_CLUSTER,
                # The body mutation of a large prompt comes back in one message.
                max_receive_message_length=policy.max_body_bytes + (1 << 20),
            ),
        ),
        failure_mode_allow=allow,
        processing_mode=ext_proc.ProcessingMode(
            request_header_mode=ext_proc.ProcessingModeHeaderSendMode.SEND,
            response_header_mode=ext_proc.ProcessingModeHeaderSendMode.SKIP,
            request_body_mode=ext_proc.ProcessingModeBodySendMode.BUFFERED,
            response_body_mode=ext_proc.ProcessingModeBodySendMode.NONE,
            request_trailer_mode=ext_proc.ProcessingModeHeaderSendMode.SKIP,
            response_trailer_mode=ext_proc.ProcessingModeHeaderSendMode.SKIP,
        ),
        # Non-inference paths skip the body phase through a mode override.
        allow_mode_override=True,
        message_timeout=_duration_ms(policy.message_timeout_ms),
        metadata_options=ext_proc.MetadataOptions(
            receiving_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(
                untyped=[METADATA_NAMESPACE]
            ),
            # Verified JWT claims reach the sidecar with the request headers.
            forwarding_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(
                untyped=[JWT_AUTHN_NAMESPACE]
            )
            if policy.jwt is not None
            else None,
        ),
        # A failed sidecar is a bad gateway, not a 500 bug; and never the breaker's 503.
        status_on_error=_http_status(SIDECAR_FAILURE_STATUS),
    )
    return hcm.HttpFilter(**_typed("envoy.filters.http.ext_proc", config))


def _http_status(code: int) -> Any:
    import envoy_data_plane.envoy.type.v3 as envoy_type

    return envoy_type.HttpStatus(code=envoy_type.StatusCode(code))


def usage_tap_filter() -> hcm.HttpFilter:
    config = lua.Lua(default_source_code=core.DataSource(inline_string=usage_tap_lua()))
    return hcm.HttpFilter(**_typed("envoy.filters.http.lua", config))


def router_filter() -> hcm.HttpFilter:
    return hcm.HttpFilter(**_typed("envoy.filters.http.router", router.Router()))


def access_log() -> accesslog.AccessLog:
    """Entries go to the sidecar through its cluster, batched."""
    config = grpc_log.HttpGrpcAccessLogConfig(
        common_config=grpc_log.CommonGrpcAccessLogConfig(
            log_name=ACCESS_LOG_NAME,
            grpc_service=core.GrpcService(
                envoy_grpc=core.GrpcServiceEnvoyGrpc(cluster_name=SIDECAR_CLUSTER)
            ),
            transport_api_version=core.ApiVersion.V3,
            # Batched: under load the 16 KiB buffer fills first and one gRPC message carries
            # many entries. The interval bounds how long a finished request holds its
            # concurrency slot (settlement waits for its entry) when traffic is quiet.
            buffer_flush_interval=_duration_ms(20),
            buffer_size_bytes=16 * 1024,
            custom_tags=[tracing.CustomTag(tag=k, value=v) for k, v in ACCESS_LOG_TAGS.items()],
        ),
    )
    return accesslog.AccessLog(**_typed("envoy.access_loggers.http_grpc", config))


def _shadow(policy: Policy) -> list[route.RouteActionRequestMirrorPolicy]:
    """Routed inference requests, sampled, copied to the shadow pool; its answers are
    dropped by Envoy, so clients and budgets never see them."""
    if policy.shadow is None:
        return []
    per_million = round(policy.shadow.fraction * 1_000_000)
    return [
        route.RouteActionRequestMirrorPolicy(
            cluster=policy.shadow.pool,
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
        for name in RATE_LIMIT_HEADERS
    ]


def _path_match(path: str) -> route.RouteMatch:
    """Exactly this path, with or without one trailing slash. One regex per path: RE2's
    default program size limit (100) is too small for the list as one alternation."""
    return route.RouteMatch(safe_regex=matcher.RegexMatcher(regex=f"^{re.escape(path)}/?$"))


# A trailing slash names the same API; engines see the path without it (as the sidecar does).
_NO_TRAILING_SLASH = matcher.RegexMatchAndSubstitute(
    pattern=matcher.RegexMatcher(regex="^(.+)/$"), substitution="\\1"
)


def _ext_proc_per_route(mode: FailureMode | None, disabled: bool = False) -> dict[str, Any]:
    if disabled:
        config = ext_proc.ExtProcPerRoute(disabled=True)
    elif mode is None:
        return {}
    else:
        config = ext_proc.ExtProcPerRoute(
            overrides=ext_proc.ExtProcOverrides(failure_mode_allow=mode is FailureMode.OPEN)
        )
    return {"typed_per_filter_config": {"envoy.filters.http.ext_proc": pb.Any.pack(config)}}


def _failure_modes(policy: Policy) -> list[tuple[str, FailureMode | None]]:
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
        **_ext_proc_per_route(None, disabled=True),
    )


def route_config(policy: Policy) -> route.RouteConfiguration:
    """Routes, in order:
    - one per pool, matching the pool the sidecar put in dynamic metadata; the sidecar sets
      it only for requests on an enabled API that it admitted (clients can send any header,
      but cannot write metadata: only the sidecar picks a pool);
    - one per forwarded path without a sidecar decision, to the default pool: public paths,
      and the first match of every API request (it carries the path's failure mode; when the
      sidecar answers, its decision re-routes the request to a pool route);
    - everything else: a 404 from Envoy itself (default deny).
    """
    timeout = dt.timedelta(seconds=policy.upstream_timeout_s)
    routes = [
        route.Route(
            name=f"pool_{pool}",
            match=route.RouteMatch(
                prefix="/",
                dynamic_metadata=[
                    matcher.MetadataMatcher(
                        filter=METADATA_NAMESPACE,
                        path=[matcher.MetadataMatcherPathSegment(key=POOL_FIELD)],
                        value=matcher.ValueMatcher(string_match=matcher.StringMatcher(exact=pool)),
                    )
                ],
            ),
            route=route.RouteAction(
                cluster=pool,
                timeout=timeout,
                request_mirror_policies=_shadow(policy),
                regex_rewrite=_NO_TRAILING_SLASH,
            ),
            response_headers_to_add=[_header(POOL_HEADER, pool), *_rate_limit_headers()],
        )
        for pool in policy.pools
    ]
    for path, mode in _failure_modes(policy):
        routes.append(
            route.Route(
                name=f"forwarded:{path}",
                match=_path_match(path),
                route=route.RouteAction(
                    cluster=policy.default_pool, timeout=timeout, regex_rewrite=_NO_TRAILING_SLASH
                ),
                response_headers_to_add=[_header(POOL_HEADER, policy.default_pool)],
                **_ext_proc_per_route(mode),
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


JWKS_CLUSTER = "slogate_jwks"
JWT_FAILURE_KEY = "jwt_failure"


def jwt_filter(policy: Policy) -> hcm.HttpFilter | None:
    """jwt_authn before ext_proc: Envoy answers bad or missing tokens with 401 itself and
    hands the verified claims to the sidecar as metadata."""
    config = policy.jwt
    if config is None:
        return None
    if config.jwks_file is not None:
        jwks: dict[str, Any] = {"local_jwks": core.DataSource(filename=config.jwks_file)}
    else:
        assert config.jwks_uri is not None
        jwks = {
            "remote_jwks": jwt_authn.RemoteJwks(
                http_uri=core.HttpUri(
                    uri=config.jwks_uri, cluster=JWKS_CLUSTER, timeout=dt.timedelta(seconds=5)
                ),
                cache_duration=dt.timedelta(minutes=10),
            )
        }
    provider = jwt_authn.JwtProvider(
        issuer=config.issuer,
        audiences=list(config.audiences),
        payload_in_metadata=JWT_PAYLOAD_KEY,
        failed_status_in_metadata=JWT_FAILURE_KEY,  # lets the local reply mapper find it
        forward=False,  # the token stops here; upstreams get slogate's headers
        **jwks,
    )
    requirement = (
        jwt_authn.JwtRequirement(provider_name="slogate")
        if config.required
        else jwt_authn.JwtRequirement(
            requires_any=jwt_authn.JwtRequirementOrList(
                requirements=[
                    jwt_authn.JwtRequirement(provider_name="slogate"),
                    jwt_authn.JwtRequirement(allow_missing=pb.Empty()),
                ]
            )
        )
    )
    # Every forwarded path but the public ones needs the token; unknown paths get the 404.
    authn = jwt_authn.JwtAuthentication(
        providers={"slogate": provider},
        rules=[
            jwt_authn.RequirementRule(match=_path_match(path), requires=requirement)
            for path in sorted(policy.paths.apis)
        ],
    )
    return hcm.HttpFilter(**_typed(JWT_AUTHN_NAMESPACE, authn))


def _jwks_cluster(uri: str) -> cluster.Cluster:
    match = re.match(r"^(https?)://([^/:]+)(?::(\d+))?/", uri)
    assert match is not None  # the policy loader checked the form
    scheme, host = match.group(1), match.group(2)
    port = int(match.group(3) or (443 if scheme == "https" else 80))
    jwks = _static_cluster(JWKS_CLUSTER, ((host, port),))
    if scheme == "https":
        jwks.transport_socket = core.TransportSocket(
            **_typed(
                "envoy.transport_sockets.tls",
                tls.UpstreamTlsContext(sni=host),
            )
        )
    return jwks


def _downstream_tls(policy: Policy) -> core.TransportSocket | None:
    if policy.tls is None:
        return None
    context = tls.DownstreamTlsContext(
        common_tls_context=tls.CommonTlsContext(
            tls_certificates=[
                tls.TlsCertificate(
                    certificate_chain=core.DataSource(filename=policy.tls.cert_file),
                    private_key=core.DataSource(filename=policy.tls.key_file),
                )
            ],
            alpn_protocols=["h2", "http/1.1"],
        )
    )
    return core.TransportSocket(**_typed("envoy.transport_sockets.tls", context))


def http_connection_manager(
    policy: Policy, profile: FilterProfile = FilterProfile.SLOGATE
) -> hcm.HttpConnectionManager:
    authn = [f for f in (jwt_filter(policy),) if f is not None]
    filters = {
        FilterProfile.SLOGATE: [
            *authn,
            ext_proc_filter(policy),
            usage_tap_filter(),
            router_filter(),
        ],
        FilterProfile.EXT_PROC_ONLY: [*authn, ext_proc_filter(policy), router_filter()],
        FilterProfile.PLAIN: [router_filter()],
    }[profile]
    logs = [access_log()] if profile is FilterProfile.SLOGATE else []
    return hcm.HttpConnectionManager(
        stat_prefix="slogate_ingress",
        codec_type=hcm.HttpConnectionManagerCodecType.AUTO,
        route_config=route_config(policy),
        http_filters=filters,
        access_log=logs,
        local_reply_config=local_reply_config(),
        # The path the routes and the sidecar decide on is the one engines act on: RFC 3986
        # normalised (percent-encoded unreserved characters decoded, dot segments removed,
        # backslashes made slashes), slashes merged, escaped slashes (%2F, %5C) unescaped.
        # Otherwise `/v1/%63hat/completions` misses every rule and an engine, which decodes
        # the path itself, serves it.
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=(
            hcm.HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_FORWARD
        ),
        # Streams may run for minutes; the route timeout bounds them, not an idle timer.
        stream_idle_timeout=dt.timedelta(seconds=policy.upstream_timeout_s),
    )


def _static_cluster(
    name: str, endpoints: tuple[tuple[str, int], ...], http2: bool = False
) -> cluster.Cluster:
    options: dict[str, Any] = {}
    if http2:
        protocol = upstream_http.HttpProtocolOptions(
            explicit_http_config=upstream_http.HttpProtocolOptionsExplicitHttpConfig(
                http2_protocol_options=core.Http2ProtocolOptions(
                    connection_keepalive=core.KeepaliveSettings(
                        interval=dt.timedelta(seconds=30), timeout=dt.timedelta(seconds=5)
                    )
                )
            )
        )
        options["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": pb.Any.pack(protocol)
        }
    return cluster.Cluster(
        name=name,
        type=cluster.ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=dt.timedelta(seconds=2),
        dns_lookup_family=cluster.ClusterDnsLookupFamily.V4_ONLY,
        load_assignment=endpoint.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint.LbEndpoint(endpoint=endpoint.Endpoint(address=_address(h, p)))
                        for h, p in endpoints
                    ]
                )
            ],
        ),
        **options,
    )


def build_bootstrap(
    policy: Policy,
    ports: EnvoyPorts | None = None,
    profile: FilterProfile = FilterProfile.SLOGATE,
) -> dict[str, Any]:
    ports = ports or EnvoyPorts()
    manager = http_connection_manager(policy, profile)
    clusters = [_static_cluster(p.name, p.endpoints) for p in policy.pools.values()]
    clusters.append(
        _static_cluster(SIDECAR_CLUSTER, ((ports.host, ports.sidecar_port),), http2=True)
    )
    if policy.jwt is not None and policy.jwt.jwks_uri is not None:
        clusters.append(_jwks_cluster(policy.jwt.jwks_uri))
    config = bootstrap.Bootstrap(
        admin=bootstrap.Admin(address=_address(ports.host, ports.admin_port)),
        static_resources=bootstrap.BootstrapStaticResources(
            listeners=[
                listener.Listener(
                    name="inference",
                    address=_address(ports.listen_host or ports.host, ports.listen_port),
                    filter_chains=[
                        listener.FilterChain(
                            transport_socket=_downstream_tls(policy),
                            filters=[
                                listener.Filter(
                                    **_typed(
                                        "envoy.filters.network.http_connection_manager", manager
                                    )
                                )
                            ],
                        )
                    ],
                )
            ],
            clusters=clusters,
        ),
    )
    result: dict[str, Any] = config.to_dict()
    return result
