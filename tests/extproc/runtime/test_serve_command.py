"""`slogate serve`'s listener options (TLS, the health port, the Unix socket) refused when
they cannot serve; what `slogate serve` must
not load, as a set: the simulator and every part of `tooling` but
its command line (tests.support.serve_imports). A real `slogate serve` read for them:
tests/e2e/extproc/runtime/test_serve_command.py, whose docstring says why."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from extproc.runtime.serve_command import listener_arguments, serve_arguments, serve_sidecar
from tests.support.serve_imports import forbidden
from tests.support.stack import EXAMPLE_POLICY


def test_the_forbidden_set() -> None:
    assert forbidden("sim") and forbidden("sim.studies.scenarios")
    assert forbidden("tooling.benchmarks.overhead") and forbidden("tooling.loadtest.run")
    assert forbidden("tooling.stack.local") and forbidden("tooling.render.envoy_config")
    assert not forbidden("tooling.cli.simulate") and not forbidden("tooling")
    assert not forbidden("simplejson") and not forbidden("extproc.runtime.supervisor")
    assert forbidden("statsmodels.tsa.holtwinters") and not forbidden("forecast.seasonal")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert"),
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "no such file: c.pem, k.pem"),
        (["--health-host", "0.0.0.0"], "--health-host needs --health-port"),
        (["--grpc-socket", "g.sock", "--workers", "2"], "--grpc-socket takes one process"),
        (["--region", "eu"], "--region 'eu' is not in the policy's regions.list (none"),
    ],
)
def test_listener_options_that_cannot_serve_are_refused_before_anything_starts(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    args = parser.parse_args(["--policy", str(EXAMPLE_POLICY), *flags])
    assert serve_sidecar(args) == 2
    assert says in capsys.readouterr().err
    each_worker = ["--health-port", "9003", "--health-host", "0.0.0.0", "--region", "eu"]
    assert listener_arguments(parser.parse_args(each_worker)) == tuple(each_worker)
