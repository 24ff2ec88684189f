"""What renders configuration from a policy; nothing here starts a process.

What lives here: envoy_config/ (the Envoy bootstrap and the fragment for an Envoy of yours),
k8s (the Kubernetes manifests), mesh (Istio's EnvoyFilter), mesh_gateway (Envoy Gateway's
policies), alert_rules (the shipped Prometheus rules, and their scaled copy for tests).
"""
