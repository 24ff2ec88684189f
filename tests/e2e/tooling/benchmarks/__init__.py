"""End-to-end tests of tooling/benchmarks/: each starts real processes."""
