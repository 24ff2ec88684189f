"""End-to-end tests of admission/: each starts real processes."""
