"""End-to-end tests of tooling/render/envoy_config/: each starts real processes."""
