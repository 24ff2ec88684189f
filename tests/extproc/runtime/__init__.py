"""Tests of extproc/runtime/: the sidecar, its supervisor, key store, policy reloads, probes."""
