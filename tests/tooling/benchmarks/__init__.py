"""Tests of tooling/benchmarks/: the LiteLLM arm and the profile summary."""
