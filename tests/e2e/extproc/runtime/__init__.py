"""End-to-end tests of extproc/runtime/: each starts real processes."""
