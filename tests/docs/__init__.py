"""Tests of docs/ and README.md: every command and reference in them, held to the code."""
