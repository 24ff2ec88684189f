"""Run a module (the sidecar's `tooling.cli.main serve`, the pass-through) under yappi,
profiling only between two SIGUSR1s: the first starts yappi (CPU clock, every thread), the
second stops it and saves its function statistics as pstats to $SLOGATE_YAPPI_OUT.

A file path, not only a module (`python path/to/yappi_serve.py MODULE ARGS...`): `bench
stages --product-tree` runs another checkout's sidecar (a baseline commit) under it, whose
tooling package has no such module. yappi is a deterministic profiler: every Python call is
timed, and timing costs (~3x here), so its seconds are shares, scaled by the caller
(tooling.benchmarks.stages) to the CPU an unprofiled run measured.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from types import FrameType

import yappi


def _toggle(_signal: int, _frame: FrameType | None) -> None:
    if not yappi.is_running():
        yappi.clear_stats()
        yappi.start(builtins=False, profile_threads=True)
        return
    yappi.stop()
    yappi.get_func_stats().save(os.environ["SLOGATE_YAPPI_OUT"], type="pstat")


def main() -> None:
    # Run by path, this folder leads sys.path: off it, or its profile.py would shadow the
    # standard library's for the whole process.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    yappi.set_clock_type("cpu")
    signal.signal(signal.SIGUSR1, _toggle)
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
