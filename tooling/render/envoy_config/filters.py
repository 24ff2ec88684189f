"""The HTTP filters slogate adds: jwt_authn, ext_proc, the usage tap (usage_tap), the
router, and the gRPC access log to the sidecar."""

from __future__ import annotations

import datetime as dt
from typing import Any

import envoy_data_plane.envoy.config.accesslog.v3 as accesslog
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.extensions.access_loggers.grpc.v3 as grpc_log
import envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 as ext_proc
import envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 as jwt_authn
import envoy_data_plane.envoy.extensions.filters.http.router.v3 as router
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.envoy.type.tracing.v3 as tracing
import envoy_data_plane.google.protobuf as pb

from extproc.request.contract import (
    ACCESS_LOG_NAME,
    ACCESS_LOG_TAGS,
    DESTINATION_NAMESPACE,
    EXT_PROC_FILTER,
    FORWARDED_NAMESPACE,
    JWT_FILTER,
    JWT_PAYLOAD_KEY,
    METADATA_NAMESPACE,
    SETTLE_PROMPTLY_FIELD,
    SIDECAR_CLUSTER,
    SIDECAR_FAILURE_STATUS,
)
from extproc.service.replies import wait_reply_ms
from policy._data_path import ExtProcMessages
from policy.domain import FailureMode
from policy.schema import Policy
from tooling.render.envoy_config._common import _duration_ms, _http_status, _typed
from tooling.render.envoy_config.one_message import (
    forward_headers_filter,
    hold_filter,
    processing_mode,
)
from tooling.render.envoy_config.routes import _path_match
from tooling.render.envoy_config.usage_tap import usage_tap_filters


def max_message_timeout_ms(policy: Policy) -> int:
    """The longest Envoy may wait for one sidecar reply: the override the sidecar sends for
    a request that waits the policy's longest wait (the wait, the message timeout and the
    margin that lets the waiting room's own 503 come first; extproc.service.replies)."""
    return wait_reply_ms(policy.longest_wait_s, policy.message_timeout_ms)


def ext_proc_filter(
    policy: Policy, failure_mode_allow: bool | None = None, cluster: str = SIDECAR_CLUSTER
) -> hcm.HttpFilter:
    """`cluster`: the sidecar's (a mesh names its own, e.g. Istio's outbound cluster)."""
    allow = (
        policy.failure_mode is FailureMode.OPEN
        if failure_mode_allow is None
        else failure_mode_allow
    )
    one = policy.data_path.messages is ExtProcMessages.ONE
    forwarded = [JWT_FILTER] if policy.jwt is not None else []
    if one:
        forwarded.append(FORWARDED_NAMESPACE)
    config = ext_proc.ExternalProcessor(
        grpc_service=core.GrpcService(
            envoy_grpc=core.GrpcServiceEnvoyGrpc(
                cluster_name=cluster,
                # The body mutation of a large prompt comes back in one message.
                max_receive_message_length=policy.max_body_bytes + (1 << 20),
            ),
        ),
        failure_mode_allow=allow,
        # One message per request: the body alone (tooling.render.envoy_config.one_message).
        processing_mode=processing_mode(headers=not one, body=True),
        # Non-inference paths skip the body phase through a mode override.
        allow_mode_override=True,
        message_timeout=_duration_ms(policy.message_timeout_ms),
        # A request waiting for room in its pool (the waiting room) is held by the sidecar,
        # which then lifts this one message's timeout with override_message_timeout; Envoy
        # ignores an override above this, so it is the longest wait's by the same rule.
        max_message_timeout=_duration_ms(max_message_timeout_ms(policy)),
        metadata_options=ext_proc.MetadataOptions(
            # slogate's own, and the endpoint picker protocol's destination (Envoy drops
            # dynamic metadata of a namespace not listed here).
            receiving_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(
                untyped=[METADATA_NAMESPACE, DESTINATION_NAMESPACE]
            ),
            # Verified JWT claims reach the sidecar with the request headers (and, with one
            # message, the headers it reads: one_message.forward_headers_filter).
            forwarding_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(untyped=forwarded)
            if forwarded
            else None,
        ),
        # A failed sidecar is a bad gateway, not a 500 bug; and never the breaker's 503.
        status_on_error=_http_status(SIDECAR_FAILURE_STATUS),
    )
    return hcm.HttpFilter(**_typed(EXT_PROC_FILTER, config))


def slogate_filters(policy: Policy, cluster: str = SIDECAR_CLUSTER) -> list[hcm.HttpFilter]:
    """slogate's HTTP filters, in their order; they go just before the router."""
    authn = [f for f in (jwt_filter(policy),) if f is not None]
    return [*authn, *request_processing(policy, cluster), *usage_tap_filters(policy)]


def request_processing(policy: Policy, cluster: str = SIDECAR_CLUSTER) -> list[hcm.HttpFilter]:
    """ext_proc, and with one message per request the filters around it that forward the
    headers the sidecar reads and hold the request until its reply (one_message)."""
    processor = ext_proc_filter(policy, cluster=cluster)
    if policy.data_path.messages is ExtProcMessages.ONE:
        return [forward_headers_filter(), processor, hold_filter(policy)]
    return [processor]


def router_filter() -> hcm.HttpFilter:
    return hcm.HttpFilter(**_typed("envoy.filters.http.router", router.Router()))


def access_logs(cluster: str = SIDECAR_CLUSTER) -> list[accesslog.AccessLog]:
    """Entries go to the sidecar through its cluster: batched, but for the requests the
    sidecar marked `settle_promptly` (their pool waits for what they free), each sent as it
    is written. Each entry goes through exactly one of the two."""
    return [_access_log(cluster, prompt=False), _access_log(cluster, prompt=True)]


def _access_log(cluster: str, prompt: bool) -> accesslog.AccessLog:
    config = grpc_log.HttpGrpcAccessLogConfig(
        common_config=grpc_log.CommonGrpcAccessLogConfig(
            log_name=ACCESS_LOG_NAME,
            grpc_service=core.GrpcService(
                envoy_grpc=core.GrpcServiceEnvoyGrpc(cluster_name=cluster)
            ),
            transport_api_version=core.ApiVersion.V3,
            # Batched: under load the 16 KiB buffer fills first and one gRPC message carries
            # many entries. The interval bounds how long a finished request holds its
            # concurrency slot and its KV (settlement waits for its entry) when traffic is
            # quiet. The prompt logger's buffer of one byte sends every entry at once.
            buffer_flush_interval=_duration_ms(20),
            buffer_size_bytes=1 if prompt else 16 * 1024,
            custom_tags=[tracing.CustomTag(tag=k, value=v) for k, v in ACCESS_LOG_TAGS.items()],
        ),
    )
    marked = accesslog.MetadataFilter(
        matcher=matcher.MetadataMatcher(
            filter=METADATA_NAMESPACE,
            path=[matcher.MetadataMatcherPathSegment(key=SETTLE_PROMPTLY_FIELD)],
            # Envoy's access-log metadata filter ignores the matcher's `invert`: the batched
            # logger takes the entries whose mark is false instead (checked on Envoy 1.40).
            value=matcher.ValueMatcher(bool_match=prompt),
        ),
        # Entries without the mark (most; refusals; requests never routed) are batched.
        match_if_key_not_found=not prompt,
    )
    return accesslog.AccessLog(
        **_typed("envoy.access_loggers.http_grpc", config),
        filter=accesslog.AccessLogFilter(metadata_filter=marked),
    )


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
    return hcm.HttpFilter(**_typed(JWT_FILTER, authn))
