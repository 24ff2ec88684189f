"""Tests of deploy/: alert rules, dashboards, runbook and manifests held to the code."""
