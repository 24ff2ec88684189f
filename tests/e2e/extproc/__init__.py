"""End-to-end tests of extproc/: each starts real processes."""
