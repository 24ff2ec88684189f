"""Tests of tooling/render/envoy_config/: the bootstrap, the fragment, one-message mode."""
