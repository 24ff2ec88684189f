"""Offline measurements of slogate components; run as `python -m tooling.benchmarks.<name>`.

Nothing here is imported by the request path.
"""
