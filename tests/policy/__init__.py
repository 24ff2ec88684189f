"""Tests of policy/: the loader, tenants, spend prices, the keyring."""
