"""`slogate loadtest`'s CPU share per process: what each part of the stack, the load
generator and the rest of the machine got of its cores over a run.

What lives here: `cpu_shares`, the arithmetic, pure, over the whole machine's readings
(tooling.stack.processes.read_machine: /proc/stat and /proc/loadavg, Linux). On a shared
2-core machine a live run's numbers depend on who else ran: a real engine starved of CPU
answers late whatever slogate decides, so the report says what each process got and what
everyone else on the machine took meanwhile.

The rows: each named process tree's CPU seconds over the window (utime + stime of the tree,
from tooling.loadtest.scrape.ProcessSampler) as cores (seconds / wall seconds) and as a share
of the machine (cores / the machine's cores); "other processes" is the machine's busy time
less the named ones' (another user's work, the kernel's); "idle" what nobody used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tooling.stack.processes import MachineReading

OTHERS = "other processes"
IDLE = "idle"


def cpu_shares(
    processes: Mapping[str, tuple[float, float]],
    machine: tuple[MachineReading, MachineReading] | None,
    wall_s: float,
    cores: int,
    loads: Sequence[float] = (),
) -> dict[str, Any]:
    """Over one window of `wall_s` seconds: `processes` maps a name to its CPU seconds at the
    window's start and end; `machine` the readings at its start and end (None: unknown, no
    "other processes" or "idle" row). Each row: `cores` (CPU seconds per wall second) and
    `share` (of the machine's `cores`); `loads`: the load averages read meanwhile."""
    wall = max(wall_s, 1e-9)
    rows: dict[str, dict[str, float]] = {}
    for name, (start, end) in processes.items():
        used = max(0.0, end - start)
        rows[name] = {"cpu_s": used, "cores": used / wall, "share": used / wall / cores}
    if machine is not None:
        first, last = machine
        busy = max(0.0, last.busy_s - first.busy_s)
        # /proc/stat's total grows by cores x wall: its own span is the machine's window.
        span = max(last.total_s - first.total_s, 1e-9)
        ours = sum(r["cpu_s"] for r in rows.values())
        others = max(0.0, busy - ours)
        idle = max(0.0, span - busy)
        for name, seconds in ((OTHERS, others), (IDLE, idle)):
            rows[name] = {
                "cpu_s": seconds,
                "cores": seconds / span * cores,
                "share": seconds / span,
            }
    return {
        "cores": cores,
        "wall_s": wall_s,
        "load1_mean": sum(loads) / len(loads) if loads else None,
        "load1_max": max(loads, default=None),
        "rows": rows,
    }
