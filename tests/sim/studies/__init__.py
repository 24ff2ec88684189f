"""Tests of sim/studies/: scenarios and workload fitting."""
