"""The listener, the HTTP connection manager, the clusters, and the whole bootstrap."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import envoy_data_plane.envoy.config.bootstrap.v3 as bootstrap
import envoy_data_plane.envoy.config.cluster.v3 as cluster
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.endpoint.v3 as endpoint
import envoy_data_plane.envoy.config.listener.v3 as listener
import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
import envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 as tls
import envoy_data_plane.envoy.extensions.upstreams.http.v3 as upstream_http
import envoy_data_plane.envoy.type.matcher.v3 as matcher
import envoy_data_plane.google.protobuf as pb

from admission.crossing import crossing_pool
from extproc.request.contract import SIDECAR_CLUSTER
from policy.domain import Pool
from policy.schema import Policy
from tooling.render.envoy_config._common import _address, _pipe, _typed
from tooling.render.envoy_config.engines import engine_cluster_options
from tooling.render.envoy_config.filters import (
    JWKS_CLUSTER,
    access_logs,
    jwt_filter,
    max_message_timeout_ms,
    request_processing,
    router_filter,
    slogate_filters,
)
from tooling.render.envoy_config.local_replies import local_reply_config
from tooling.render.envoy_config.profile import EnvoyPorts, FilterProfile, SidecarTls
from tooling.render.envoy_config.routes import route_config


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


def manager_settings(policy: Policy) -> dict[str, Any]:
    """The HTTP connection manager's settings slogate needs (the contract's local replies,
    path normalisation and stream idle timeout), as keyword arguments: for the bootstrap's
    manager and for the fragment an operator merges into their own."""
    return dict(
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
        # Streams may run for minutes; the route timeout bounds them, not an idle timer. The
        # idle timer also runs while the sidecar holds a request in its waiting room, and
        # nothing on the ext_proc stream resets it (checked on Envoy 1.40): it must outlast
        # the longest Envoy may wait for the held reply.
        stream_idle_timeout=dt.timedelta(
            seconds=max(policy.upstream_timeout_s, max_message_timeout_ms(policy) / 1000 + 5.0)
        ),
    )


def http_connection_manager(
    policy: Policy, profile: FilterProfile = FilterProfile.SLOGATE
) -> hcm.HttpConnectionManager:
    authn = [f for f in (jwt_filter(policy),) if f is not None]
    filters = {
        FilterProfile.SLOGATE: [*slogate_filters(policy), router_filter()],
        FilterProfile.EXT_PROC_ONLY: [*authn, *request_processing(policy), router_filter()],
        FilterProfile.PLAIN: [router_filter()],
    }[profile]
    logs = access_logs() if profile is FilterProfile.SLOGATE else []
    return hcm.HttpConnectionManager(
        stat_prefix="slogate_ingress",
        codec_type=hcm.HttpConnectionManagerCodecType.AUTO,
        route_config=route_config(policy),
        http_filters=filters,
        access_log=logs,
        **manager_settings(policy),
    )


# Streams per connection to the sidecar before Envoy opens a new one (see _static_cluster).
SIDECAR_STREAMS_PER_CONNECTION = 1000


def pool_cluster(pool: Pool, policy: Policy) -> cluster.Cluster:
    """A pool's engines: every endpoint (every address a DNS name resolves to) is a host,
    health-checked, ejected on errors, picked by slogate (tooling.render.envoy_config.engines)."""
    return _static_cluster(pool.name, pool.endpoints, **engine_cluster_options(policy))


def _static_cluster(
    name: str,
    endpoints: tuple[tuple[str, int], ...],
    http2: bool = False,
    **fields: Any,
) -> cluster.Cluster:
    options: dict[str, Any] = dict(fields)
    if http2:
        protocol = upstream_http.HttpProtocolOptions(
            # A connection is replaced after this many streams: with `slogate serve
            # --workers N` behind one port (SO_REUSEPORT spreads connections, not streams),
            # the kernel places every new one again, so no worker keeps the load of all.
            common_http_protocol_options=core.HttpProtocolOptions(
                max_requests_per_connection=SIDECAR_STREAMS_PER_CONNECTION
            ),
            explicit_http_config=upstream_http.HttpProtocolOptionsExplicitHttpConfig(
                http2_protocol_options=core.Http2ProtocolOptions(
                    connection_keepalive=core.KeepaliveSettings(
                        interval=dt.timedelta(seconds=30), timeout=dt.timedelta(seconds=5)
                    )
                )
            ),
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


def region_clusters(policy: Policy) -> list[cluster.Cluster]:
    """Each peer region's ingress (its Envoy) that requests cross to, where crossing is on
    (the route: tooling.render.envoy_config.routes.region_routes)."""
    if not policy.regions.crossing.enabled:
        return []
    clusters = []
    for peer in policy.regions.peers():
        if peer.ingress is None:
            continue
        host, _, port = peer.ingress.rpartition(":")
        clusters.append(_static_cluster(crossing_pool(peer.name), ((host, int(port)),)))
    return clusters


def sidecar_transport(sidecar_tls: SidecarTls) -> core.TransportSocket:
    """TLS to the sidecar: its certificate checked against the CA (and the name, when
    given), h2 offered by ALPN (gRPC's servers insist on it), Envoy's client certificate
    for mutual TLS."""
    validation = tls.CertificateValidationContext(
        trusted_ca=core.DataSource(filename=sidecar_tls.ca_file)
    )
    if sidecar_tls.server_name is not None:
        validation.match_typed_subject_alt_names = [
            tls.SubjectAltNameMatcher(
                san_type=tls.SubjectAltNameMatcherSanType.DNS,
                matcher=matcher.StringMatcher(exact=sidecar_tls.server_name),
            )
        ]
    common = tls.CommonTlsContext(validation_context=validation, alpn_protocols=["h2"])
    if sidecar_tls.cert_file is not None and sidecar_tls.key_file is not None:
        common.tls_certificates = [
            tls.TlsCertificate(
                certificate_chain=core.DataSource(filename=sidecar_tls.cert_file),
                private_key=core.DataSource(filename=sidecar_tls.key_file),
            )
        ]
    context = tls.UpstreamTlsContext(common_tls_context=common, sni=sidecar_tls.server_name or "")
    return core.TransportSocket(**_typed("envoy.transport_sockets.tls", context))


def slogate_clusters(
    policy: Policy,
    host: str,
    port: int,
    sidecar_tls: SidecarTls | None = None,
    sidecar_socket: str | None = None,
) -> list[cluster.Cluster]:
    """The sidecar's cluster at `host`:`port`, or at the Unix socket `sidecar_socket` (a
    pipe address; STATIC: a path has nothing to resolve); and the JWKS server's, when the
    policy fetches keys."""
    sidecar = _static_cluster(SIDECAR_CLUSTER, ((host, port),), http2=True)
    if sidecar_socket is not None:
        sidecar.type = cluster.ClusterDiscoveryType.STATIC
        sidecar.dns_lookup_family = cluster.ClusterDnsLookupFamily.AUTO
        sidecar.load_assignment = endpoint.ClusterLoadAssignment(
            cluster_name=SIDECAR_CLUSTER,
            endpoints=[
                endpoint.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint.LbEndpoint(
                            endpoint=endpoint.Endpoint(address=_pipe(sidecar_socket))
                        )
                    ]
                )
            ],
        )
    if sidecar_tls is not None:
        sidecar.transport_socket = sidecar_transport(sidecar_tls)
    clusters = [sidecar]
    if policy.jwt is not None and policy.jwt.jwks_uri is not None:
        clusters.append(_jwks_cluster(policy.jwt.jwks_uri))
    return clusters


def build_bootstrap(
    policy: Policy,
    ports: EnvoyPorts | None = None,
    profile: FilterProfile = FilterProfile.SLOGATE,
) -> dict[str, Any]:
    ports = ports or EnvoyPorts()
    manager = http_connection_manager(policy, profile)
    clusters = [pool_cluster(p, policy) for p in policy.pools.values()]
    clusters += region_clusters(policy)
    clusters += slogate_clusters(
        policy, ports.host, ports.sidecar_port, ports.sidecar_tls, ports.sidecar_socket
    )
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
