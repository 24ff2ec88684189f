"""End-to-end tests of extproc/service/: each starts real processes."""
