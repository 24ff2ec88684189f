"""Shared fixtures: the real stack (simulated pools, sidecar, Envoy) on random ports.

Helpers live in tests/support/; process logs are attached to a test's report only when the
test fails. These fixtures serve every folder below; tests/e2e/conftest.py marks its tests e2e,
and the collection hook here refuses the marker anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.runtime.processes import ManagedProcess
from policy._data_path import ExtProcMessages
from tests.support.messages import start_stack_with
from tests.support.stack import start_stack
from tests.support.vllm import require_vllm, start_vllm_stack
from tests.support.xdist_scopes import VLLM_UNIT, UnitScheduling, order, unit_of
from tooling.stack.local import LocalStack
from tooling.stack.otlp_receiver import TraceReceiver
from tooling.stack.redis import start_redis, start_redis_cluster

TESTS = Path(__file__).parent
E2E = TESTS / "e2e"
# The session's vLLM stack, for the hook that stops it after its last test.
_VLLM_STACKS: list[LocalStack] = []


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    running = start_stack(tmp_path_factory.mktemp("stack"))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def one_message_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The stack with one ext_proc message per request (policy `data_path.messages: one`)."""
    running = start_stack_with(tmp_path_factory.mktemp("stack-one"), ExtProcMessages.ONE)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The stack with a real vLLM behind the default pool (~1 min to start), shared by the
    tests marked vllm."""
    require_vllm()
    running = start_vllm_stack(tmp_path_factory.mktemp("vllm-stack"))
    _VLLM_STACKS.append(running)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One real Redis-compatible server for the session (tests use keys of their own)."""
    proc, port = start_redis(tmp_path_factory.mktemp("redis"))
    yield port
    proc.stop()


@pytest.fixture(scope="session")
def cluster_ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """A real 3-node Redis Cluster for the session."""
    procs, ports = start_redis_cluster(tmp_path_factory.mktemp("cluster"))
    yield ports
    for proc in procs:
        proc.stop()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[TraceReceiver]:
    """A real OTLP/gRPC receiver on a random port, for the sidecars a test starts."""
    # The SDK's batch delay (5 s by default), shortened for the sidecars started here.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    running = TraceReceiver().start()
    yield running
    running.stop()


@pytest.fixture
def processes() -> Iterator[list[ManagedProcess]]:
    """Processes a test starts, stopped (last first) when it ends."""
    started: list[ManagedProcess] = []
    yield started
    for proc in reversed(started):
        proc.stop()


# tryfirst: the check must see every item before `-m` deselects by the marker (the mark
# plugin's own pytest_collection_modifyitems), or `-m "not e2e"` would never see a misplaced one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `e2e` marker is given by the folder alone: a test outside tests/e2e/ that carries
    it itself stops the collection, naming its file. The tests against a real vLLM must be
    named so that the xdist units (tests/support/xdist_scopes.py) find them; then the units
    are put in the order they should start in."""
    misplaced = sorted(
        {
            str(item.path.relative_to(TESTS.parent))
            for item in items
            if not item.path.is_relative_to(E2E) and item.get_closest_marker("e2e") is not None
        }
    )
    if misplaced:
        raise pytest.UsageError(
            "the e2e marker is given by the folder tests/e2e/ alone; these files mark tests e2e "
            "themselves: move those tests to the same path under tests/e2e/ and drop the "
            "mark: " + ", ".join(misplaced)
        )
    astray = sorted(
        item.nodeid
        for item in items
        if (item.get_closest_marker("vllm") is not None) != (unit_of(item.nodeid) == VLLM_UNIT)
    )
    if astray:
        raise pytest.UsageError(
            "a test against vLLM carries the vllm marker and has vllm in its file's name or "
            "its parameter id (tests/support/xdist_scopes.py puts them on one worker by that "
            "name); these break the rule: " + ", ".join(astray[:10])
        )
    items.sort(key=lambda item: order(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` (make test): the units of tests/support/xdist_scopes.py."""
    if config.getoption("dist") == "loadgroup":
        return UnitScheduling(config, log)
    return None


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The vLLM stack stops after the last test against it (they run together, see
    `order`), so that its engine's idle loop (~10% of a core) does not run beside the rest."""
    if item.get_closest_marker("vllm") and (
        nextitem is None or not nextitem.get_closest_marker("vllm")
    ):
        for running in _VLLM_STACKS:
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
