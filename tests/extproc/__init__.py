"""Tests of extproc/: the request path, the runtime and the gRPC service."""
