"""Tests of tooling/preflight/: the checks' verdicts, zones and drills' expectations."""
