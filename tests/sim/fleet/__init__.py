"""Tests of sim/fleet/: decided as the sidecar decides, tenants held apart, engines, fitting."""
