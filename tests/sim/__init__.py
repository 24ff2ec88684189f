"""Tests of sim/: the simulated engine server, the offline fleet, the studies."""
