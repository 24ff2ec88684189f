"""The Envoy bootstrap, generated from the policy with typed Envoy API objects.

What lives here: `profile` (what a bootstrap is rendered for: EnvoyPorts, FilterProfile),
`bootstrap` (`build_bootstrap`, which assembles the pieces into the camelCase dict Envoy
accepts), and one module per piece: `filters` (ext_proc, JWT, router, access log), `routes`,
`engines` (the pools' clusters, health checks, outlier detection, the one retry),
`local_replies`, `usage_tap` (the Lua tap), `one_message` (the one-message data path) and
`fragment` (what slogate adds to an Envoy it did not generate); `_common` holds the
helpers they share. Nothing here starts Envoy; tests validate the output with
`envoy --mode validate`.

The shape, and why:
- ext_proc sees request headers and the BUFFERED body only. Its body reply carries the route
  header plus `clear_route_cache`, so the route is picked on the body (prompt + max_tokens).
  Responses never go to Python: the Lua usage tap reads usage out of the (streamed) body
  in-proxy, and one gRPC access-log entry per request carries usage and timings to the
  sidecar, batched.
- Each pool is a cluster of the same name; the route for a pool adds `x-slogate-pool` to
  the response, so clients see which pool served them without an extra round trip.
"""
