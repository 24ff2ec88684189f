"""Tests of admission/: the chain and its steps (access, budget, spend, waiting room)."""
