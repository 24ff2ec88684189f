"""End-to-end tests of budget/: each starts real processes."""
