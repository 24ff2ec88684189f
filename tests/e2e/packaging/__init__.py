"""End-to-end tests of the distribution: the sdist and the wheel built, installed and run."""
