"""End-to-end tests: each starts real processes (Envoy, sidecars, Redis, Prometheus, vLLM).

Every test collected under this folder is marked `e2e` by its conftest.py; `-m "not e2e"` (the
fast suite) leaves them out.
"""
