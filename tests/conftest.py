"""Shared fixtures: the real stack (simulated pools, sidecar, Envoy) on random ports.

Helpers live in tests/support/; process logs are attached to a test's report only when the
test fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.stack import start_stack
from tooling.stack import LocalStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    running = start_stack(tmp_path_factory.mktemp("stack"))
    yield running
    running.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name in getattr(item, "fixturenames", ()):
            value = getattr(item, "funcargs", {}).get(name)
            if isinstance(value, LocalStack):
                report.sections.append((f"process logs ({name})", value.logs()))
