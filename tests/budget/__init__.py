"""Tests of budget/: the stores (one suite, every store), failover, spend, the quota controller."""
