"""Tests of sim/fleet/: the offline fleet decides as the sidecar does; isolation under load."""
