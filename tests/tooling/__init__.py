"""Tests of tooling/: the CLI, load test, preflight, renderers and benchmarks."""
