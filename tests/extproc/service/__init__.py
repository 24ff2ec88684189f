"""Tests of extproc/service/: access log, admin, logs, metrics, replies, tracing, records."""
