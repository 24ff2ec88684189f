"""What `slogate serve` must not load, as a set: the simulator and every part of `tooling` but
its command line (tests.support.serve_imports). A real `slogate serve` read for them:
tests/e2e/extproc/runtime/test_serve_command.py, whose docstring says why."""

from __future__ import annotations

from tests.support.serve_imports import forbidden


def test_the_forbidden_set() -> None:
    assert forbidden("sim") and forbidden("sim.studies.scenarios")
    assert forbidden("tooling.benchmarks.overhead") and forbidden("tooling.loadtest.run")
    assert forbidden("tooling.stack.local") and forbidden("tooling.render.envoy_config")
    assert not forbidden("tooling.cli.simulate") and not forbidden("tooling")
    assert not forbidden("simplejson") and not forbidden("extproc.runtime.supervisor")
