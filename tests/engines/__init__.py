"""Tests of engines/: engine state, prefix hashes and index, scoring and the picker."""
