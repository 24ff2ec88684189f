"""slogate's tests, laid out as the packages they test (docs/contributors/testing.md).

tests/<package>/.../test_<module>.py holds the in-process tests of <package>/.../<module>.py;
tests/e2e/ the tests that start real processes (marked `e2e` by its folder alone), a module's
at the same path under it; tests/deploy/ and tests/docs/ hold the shipped artefacts and the docs
to the code, tests/packaging/ what pip installs; tests/support/ the helpers they share,
tests/data/ their data.
"""
