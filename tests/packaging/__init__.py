"""Tests of the distribution (pyproject.toml): what pip installs for slogate."""
