"""Tests of sim/studies/: the scenarios and their sweeps."""
