"""Tests of tooling/render/: alert rules, Kubernetes, Istio and Envoy Gateway manifests."""
