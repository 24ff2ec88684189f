"""End-to-end tests of sim/server/: each starts real processes."""
