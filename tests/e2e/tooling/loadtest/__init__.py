"""End-to-end tests of tooling/loadtest/: each starts real processes."""
