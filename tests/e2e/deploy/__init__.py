"""End-to-end tests of deploy/: each starts real processes."""
