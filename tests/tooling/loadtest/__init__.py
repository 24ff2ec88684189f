"""Tests of tooling/loadtest/: the run, its faults, calibration."""
