"""End-to-end tests of tooling/render/: each starts real processes."""
