"""How `make test` spreads the suite over two pytest-xdist workers (`-n 2 --dist loadgroup`).

A unit of work goes whole to one worker:
- an e2e file: its module-scoped stacks start once, not once per worker;
- every e2e test against the real vLLM (`vllm` in its file's name or among its parameter ids; the
  collection check in tests/conftest.py holds the `vllm` marker to that rule): the engine they
  share starts once (~35 s and ~3 GiB);
- an in-process file whose tests share a module-scoped fixture that takes minutes
  (`SHARED_SETUP_FILES`): built once, not once per worker;
- any other test alone: the in-process tests fill the gaps the e2e units leave.

The units run in the order the collection gives (`order` below): first the two that take
minutes (the live alerts' Prometheus run, ~3.5 min of real time; the vLLM tests), one per
worker, so that neither ends the run alone on one worker while the other idles; then the e2e
files; the in-process tests last, the one that waits longest first.

pytest-xdist 3.8's own `loadgroup` reads the `xdist_group` mark into the node id, a field that
pytest 9 no longer reads back: under pytest 9.2 it grouped nothing (checked here: one e2e file's
tests ran on both workers, each starting the module's stack). So the scheduler here works
from node ids alone.
"""

from __future__ import annotations

import re

import pytest
from xdist.scheduler import LoadScopeScheduling

E2E_PREFIX = "tests/e2e/"
VLLM_UNIT = "vllm"
# The e2e unit that takes the longest: started first, beside the vLLM unit.
LONGEST_FILE = "tests/e2e/test_prometheus.py"
# The in-process test that waits longest: calibrating against a simulated pool that sleeps
# its model's times (~19 s, little CPU). Started first, beside the CPU-bound rest, rather
# than last on one worker while the other has finished (`make test-fast`).
LONGEST_IN_PROCESS = "tests/tooling/loadtest/test_calibrate.py::test_calibrating_a_simulated_pool"
# In-process files whose tests share a module-scoped fixture that takes minutes: alone, each
# test went where a worker was free, so both workers built it (test_scenarios' `burst`, the
# published comparison's two simulator runs: 147 s and 155 s of setup in one CI run).
SHARED_SETUP_FILES = frozenset({"tests/sim/studies/test_scenarios.py"})
_VLLM_ID = re.compile(r"\[(?:[^\]]*-)?vllm(?:-[^\]]*)?\]$")


def unit_of(nodeid: str) -> str:
    """The unit of work a test goes in (one worker runs a unit whole)."""
    path, _, rest = nodeid.partition("::")
    if not path.startswith(E2E_PREFIX):
        return path if path in SHARED_SETUP_FILES else nodeid
    if "vllm" in path.rsplit("/", 1)[-1] or _VLLM_ID.search(rest):
        return VLLM_UNIT
    return path


def order(nodeid: str) -> int:
    """Where a test's unit goes in the run: the long units first, the in-process tests last
    (the one that waits longest first among them)."""
    unit = unit_of(nodeid)
    if unit in (LONGEST_FILE, VLLM_UNIT):
        return 0
    if unit.startswith(E2E_PREFIX) or unit in SHARED_SETUP_FILES:
        return 1
    return 2 if nodeid.startswith(LONGEST_IN_PROCESS) else 3


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduler, with `unit_of` as the scope and the collection's order kept."""

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        # The stock scheduler sorts units by their number of tests (most first), which would
        # start test_paths.py's 287 quick tests before the two long units.
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
