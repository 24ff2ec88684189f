"""`slogate loadtest`'s CPU share per process: what each part of the stack, the load
generator and the rest of the machine got of its cores over a run.

What lives here: `MachineReading` and `read_machine` (the whole machine's busy and total CPU
seconds and its load average, from /proc/stat and /proc/loadavg: Linux) and `cpu_shares`,
the arithmetic, pure. On a shared 2-core machine a live run's numbers depend on who else
ran: a real engine starved of CPU answers late whatever slogate decides, so the report says
what each process got and what everyone else on the machine took meanwhile.

The rows: each named process tree's CPU seconds over the window (utime + stime of the tree,
from tooling.loadtest.scrape.ProcessSampler) as cores (seconds / wall seconds) and as a share
of the machine (cores / the machine's cores); "other processes" is the machine's busy time
less the named ones' (another user's work, the kernel's); "idle" what nobody used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OTHERS = "other processes"
IDLE = "idle"


@dataclass(frozen=True, slots=True)
class MachineReading:
    """The machine's CPU seconds since boot, all cores together: busy (not idle, not
    waiting on I/O) and in all; its 1-minute load average."""

    busy_s: float
    total_s: float
    load1: float


def read_machine() -> MachineReading | None:
    """Now, from /proc/stat's `cpu` line and /proc/loadavg; None where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            first = stat.readline().split()
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            load1 = float(loadavg.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    per_second = os.sysconf("SC_CLK_TCK")
    total = sum(ticks)
    idle = ticks[3] + ticks[4]
    return MachineReading((total - idle) / per_second, total / per_second, load1)


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
