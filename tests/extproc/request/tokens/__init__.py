"""Tests of extproc/request/tokens/: counting prompts, the fitted estimate, block hashes."""
