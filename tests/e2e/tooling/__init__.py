"""End-to-end tests of tooling/: each starts real processes."""
