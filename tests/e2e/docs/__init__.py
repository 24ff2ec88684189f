"""End-to-end tests of docs/: each starts real processes."""
