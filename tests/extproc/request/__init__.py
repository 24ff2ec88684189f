"""Tests of extproc/request/: bodies, the per-request flow, shadow candidates."""
