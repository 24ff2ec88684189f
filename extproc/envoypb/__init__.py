"""Envoy's API messages and service stubs that slogate speaks, generated, never edited.

- `envoy.service.ext_proc.v3`: the external processor service the sidecar serves.
- `envoy.service.accesslog.v3`, `envoy.data.accesslog.v3`: the gRPC access log it receives.
- `envoy.config.core.v3`, `envoy.type.v3`, `envoy.extensions.filters.http.ext_proc.v3`,
  `udpa`, `validate`, `xds`: what those import, and nothing more.

`make protos` writes them from protos/upstream/ (tooling/build/envoy_protos.py); a test fails when
they are stale. They are ours, not a dependency's, so that no other package's files overwrite
them or are overwritten by them.
"""
