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

from tooling.render.envoy_config._common import EnvoyPorts, FilterProfile
from tooling.render.envoy_config.bootstrap import build_bootstrap, http_connection_manager
from tooling.render.envoy_config.filters import (
    JWKS_CLUSTER,
    JWT_FAILURE_KEY,
    access_log,
    ext_proc_filter,
    jwt_filter,
    router_filter,
)
from tooling.render.envoy_config.local_replies import local_reply_config
from tooling.render.envoy_config.routes import route_config
from tooling.render.envoy_config.usage_tap import usage_tap_filter, usage_tap_lua

__all__ = [
    "JWKS_CLUSTER",
    "JWT_FAILURE_KEY",
    "EnvoyPorts",
    "FilterProfile",
    "access_log",
    "build_bootstrap",
    "ext_proc_filter",
    "http_connection_manager",
    "jwt_filter",
    "local_reply_config",
    "route_config",
    "router_filter",
    "usage_tap_filter",
    "usage_tap_lua",
]
