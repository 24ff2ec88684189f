"""A pool's engines in Envoy: the cluster's load balancing, health checks and outlier
detection, and the pool routes' one retry.

What lives here, and why each piece:
- `engine_balancing`: the override-host policy (`envoy.load_balancing_policies.override_host`,
  the one the Gateway API inference extension's endpoint picker uses) reading the engines
  picked as that protocol names them: dynamic metadata `envoy.lb` /
  `x-gateway-destination-endpoint` ("ip:port,ip:port") first, the header of that name
  second, so the same cluster serves slogate or any other endpoint picker; round robin over
  the healthy engines as the fallback when no engine was named (picking off, a request
  slogate did not decide). The sidecar removes a client's copy of the header. Chosen over
  an original-destination cluster, which has no health checks, no outlier detection and
  no fallback. Checked on Envoy 1.40: the policy takes the named host whatever its health
  (its source says so: "TODO: validate that host health status did not change"), so slogate
  must not name a dead engine (it watches them itself: engines.state), and names a second
  one for the retry.
- `engine_health_checks`: GET /health on every engine every probe interval (also when
  the pool has no traffic: Envoy's default waits 60 s then), the same thresholds slogate's
  own probes use: Envoy's round robin stops sending to a dead engine within seconds.
- `engine_outlier_detection`: 5xx or failed connections in a row eject an engine that
  answers its health check but fails its requests, as slogate's own view does; at most half
  of a pool at once, so a whole pool failing stays visible (and its breaker trips).
- `engine_retry`: a request refused before any byte reached an engine (connection refused,
  reset before the request went out, HTTP/2 refused stream) is tried once more, on another
  engine (the second named, else any but the first); never a request an engine started.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import envoy_data_plane.envoy.config.cluster.v3 as cluster
import envoy_data_plane.envoy.config.core.v3 as core
import envoy_data_plane.envoy.config.route.v3 as route
import envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 as override
import envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 as round_robin
import envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 as previous_hosts
import envoy_data_plane.envoy.type.metadata.v3 as metadata
import envoy_data_plane.google.protobuf as pb

from extproc.request.contract import (
    DESTINATION_HEADER,
    DESTINATION_KEY,
    DESTINATION_NAMESPACE,
)
from policy.schema import EngineHealthConfig, Policy

# What a retry may be for: nothing reached the engine (envoy's retry_on names).
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
OVERRIDE_HOST = "envoy.load_balancing_policies.override_host"
ROUND_ROBIN = "envoy.load_balancing_policies.round_robin"


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def _extension(name: str, message: Any) -> cluster.LoadBalancingPolicyPolicy:
    return cluster.LoadBalancingPolicyPolicy(
        typed_extension_config=core.TypedExtensionConfig(
            name=name, typed_config=pb.Any.pack(message)
        )
    )


def engine_balancing() -> cluster.LoadBalancingPolicy:
    """The engine the picker named (the endpoint picker protocol's metadata, else its
    header), else Envoy's round robin over the healthy ones."""
    return cluster.LoadBalancingPolicy(
        policies=[
            _extension(
                OVERRIDE_HOST,
                override.OverrideHost(
                    override_host_sources=[
                        override.OverrideHostOverrideHostSource(
                            metadata=metadata.MetadataKey(
                                key=DESTINATION_NAMESPACE,
                                path=[metadata.MetadataKeyPathSegment(key=DESTINATION_KEY)],
                            )
                        ),
                        override.OverrideHostOverrideHostSource(header=DESTINATION_HEADER),
                    ],
                    fallback_policy=cluster.LoadBalancingPolicy(
                        policies=[_extension(ROUND_ROBIN, round_robin.RoundRobin())]
                    ),
                ),
            )
        ]
    )


def engine_health_checks(health: EngineHealthConfig) -> list[core.HealthCheck]:
    interval = _seconds(health.probe_interval_s)
    return [
        core.HealthCheck(
            timeout=_seconds(health.probe_timeout_s),
            interval=interval,
            no_traffic_interval=interval,
            unhealthy_interval=interval,
            interval_jitter=_seconds(health.probe_interval_s / 10),
            unhealthy_threshold=health.unhealthy_after,
            healthy_threshold=health.healthy_after,
            http_health_check=core.HealthCheckHttpHealthCheck(path="/health"),
        )
    ]


def engine_outlier_detection(health: EngineHealthConfig) -> cluster.OutlierDetection:
    # consecutive_5xx stays at Envoy's default (5): envoy-data-plane spells its JSON name
    # "consecutive5Xx", which Envoy refuses. Gateway failures (502-504) and local-origin
    # ones (refused, timed out) eject at slogate's count; slogate's own view (which picks)
    # ejects at it for any 5xx.
    return cluster.OutlierDetection(
        consecutive_gateway_failure=health.eject_after_errors,
        enforcing_consecutive_gateway_failure=100,  # Envoy's default: counted, never ejects
        # Refused connections and timeouts count on their own (not as a 503 Envoy made).
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=health.eject_after_errors,
        interval=_seconds(1.0),
        base_ejection_time=_seconds(health.eject_s),
        max_ejection_time=_seconds(health.eject_s * 10),
        max_ejection_percent=50,
    )


def engine_cluster_options(policy: Policy) -> dict[str, Any]:
    """The fields a pool's cluster gets (beside its name, type and endpoints)."""
    health = policy.engines.health
    return {
        "load_balancing_policy": engine_balancing(),
        "health_checks": engine_health_checks(health),
        "outlier_detection": engine_outlier_detection(health),
    }


def engine_retry() -> route.RetryPolicy:
    return route.RetryPolicy(
        retry_on=RETRY_ON,
        num_retries=1,
        retry_host_predicate=[
            route.RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=pb.Any.pack(previous_hosts.PreviousHostsPredicate()),
            )
        ],
        host_selection_retry_max_attempts=3,
    )
