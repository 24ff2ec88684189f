"""Tests of breaker/: the level machine and shedding, the engines' signals, latency windows."""
