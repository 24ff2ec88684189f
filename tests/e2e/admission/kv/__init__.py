"""End-to-end tests of admission/kv/: each starts real processes."""
