"""Tests of tooling/cli/: subcommands tested as a user types them (keys, policy)."""
