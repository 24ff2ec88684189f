"""The sidecar itself, in three layers (one import direction, checked by import-linter):
request/ (one request's path: identity, bodies, exact token counts, routing; no gRPC),
service/ (the gRPC servicers, replies, metrics and the request's observers) and runtime/
(the process: composition, loops, scrapers, `slogate serve` and its workers' supervisor).
Beside them: adminpb/ and envoypb/ (generated protobuf code: the admin API, and the Envoy API
messages slogate speaks), shipped/ (the files the package carries: example policies, alert
rules), usage_tap.lua (Envoy's in-proxy usage reader) and version.py (the one version).
"""
