"""Tests of sim/server/: the simulated engine server's latency model and its HTTP pool."""
