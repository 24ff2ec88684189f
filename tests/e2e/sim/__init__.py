"""End-to-end tests of sim/: each starts real processes."""
