"""Tests of sim/server/: the simulated engines' model, HTTP pool and engine pool."""
