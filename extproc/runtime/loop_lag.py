"""How late the sidecar's event loop runs: a ticker that sleeps a short interval and
records how much later than asked it woke.

Why: a sidecar starved of CPU (a noisy neighbour, a throttled cgroup, a long pause) sees
every timer fire late at once. An engine probe that timed out during such a stall says
nothing about the engine: counted, one starved second marked every engine of every pool
dead (measured here: a CPU vLLM's prefill starved the sidecar on a 2-core machine, and
all three pools' engines went dead in the same second). The probe round asks `worst_since`
and leaves a timeout uncounted when the loop itself lagged. SREs read the same number as
`slogate_event_loop_lag_seconds`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("slogate.loop")

TICK_S = 0.05
_KEPT_S = 60.0  # the longest a probe round or a scrape window looks back


class LoopLag:
    """Lags of the ticker's wakes (seconds late), kept for a minute (the sidecar) or for a
    whole run (the load generator's account of its own stalls)."""

    def __init__(
        self, clock: Callable[[], float], tick_s: float = TICK_S, kept_s: float = _KEPT_S
    ) -> None:
        self._clock = clock
        self.tick_s = tick_s
        self._kept_s = kept_s
        self._lags: collections.deque[tuple[float, float]] = collections.deque()
        self._last_wake_s = clock()

    def woke(self, slept_from_s: float) -> None:
        """The ticker woke from a sleep that began at `slept_from_s`."""
        now = self._clock()
        self._last_wake_s = now
        self._lags.append((now, max(0.0, now - slept_from_s - self.tick_s)))
        while self._lags and self._lags[0][0] < now - self._kept_s:
            self._lags.popleft()

    def worst_since(self, since_s: float) -> float:
        """The worst lag seen by a wake at or after `since_s`, and the lag under way now
        (the ticker's sleep overdue: a stall that has not ended yet)."""
        overdue = self.overdue_s()
        # A copy first: the metrics thread asks while the loop appends (list() of a deque
        # is one step under the GIL; iterating it live raised "deque mutated").
        recorded = (lag for at_s, lag in tuple(self._lags) if at_s >= since_s)
        return max(overdue, max(recorded, default=0.0))

    def stalls(self, longer_than_s: float) -> list[tuple[float, float]]:
        """(began, ended) on the clock of each kept stall longer than `longer_than_s`: a
        wake that late, from when the ticker should have woken."""
        return [(at_s - lag, at_s) for at_s, lag in tuple(self._lags) if lag > longer_than_s]

    @property
    def last_wake_s(self) -> float:
        return self._last_wake_s

    def overdue_s(self) -> float:
        """How long past its wake-up the ticker is now (0: the loop is running)."""
        return max(0.0, self._clock() - self._last_wake_s - self.tick_s)

    async def run(self) -> None:
        watchdog = StallWatchdog(self, threading.get_ident())
        watchdog.start()
        try:
            await self._tick()
        finally:
            watchdog.stop()

    async def _tick(self) -> None:
        while True:
            began = self._clock()
            await asyncio.sleep(self.tick_s)
            self.woke(began)


class StallWatchdog:
    """A thread that logs, once per stall, where the loop's thread is when the loop has
    not woken for `STALL_S`: a loop blocked by the sidecar's own code shows that code; a
    starved process shows the loop waiting in its selector (and this thread late too)."""

    STALL_S = 1.0

    def __init__(self, lag: LoopLag, loop_thread: int) -> None:
        self._lag = lag
        self._loop_thread = loop_thread
        # The kernel's account of the loop's thread: CPU it ran and time it sat runnable
        # on a run queue (/proc/.../schedstat, ns). A stall with a long queue wait was the
        # machine's (starved of CPU); one with neither ran nor waited, the GIL's.
        self._schedstat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-stall", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _sched(self) -> tuple[float, float] | None:
        """(ran s, waited for a CPU s) of the loop's thread so far; None: not Linux."""
        try:
            ran_ns, waited_ns, _ = self._schedstat.read_text().split()
        except (OSError, ValueError):
            return None
        return int(ran_ns) / 1e9, int(waited_ns) / 1e9

    def _watch(self) -> None:
        reported = -1.0
        # The account as of this thread's last look at a running loop: a stall began after
        # it (this thread may have been starved too, and first look once it is over 1 s).
        before = self._sched()
        while not self._stopped.wait(0.25):
            last, stalled_s = self._lag.last_wake_s, self._lag.overdue_s()
            if stalled_s < self.STALL_S:
                before = self._sched()
                continue
            if last == reported:
                continue
            reported = last
            now = self._sched()
            account = ""
            if now is not None and before is not None:
                account = (
                    f"; since before it its thread ran {1000 * (now[0] - before[0]):.0f} ms"
                    f" and waited {1000 * (now[1] - before[1]):.0f} ms for a CPU"
                )
            log.warning(
                "event loop stalled %.0f ms so far%s; the threads are at:\n%s",
                stalled_s * 1000,
                account,
                self._threads(),
            )

    def _threads(self) -> str:
        """Each thread's innermost frames, the loop's first: a loop whose thread sits in
        its selector while overdue waits for the GIL, and the thread holding it is the
        one in Python code among the others."""
        names = {t.ident: t.name for t in threading.enumerate()}
        frames = sys._current_frames()
        order = sorted(frames, key=lambda ident: ident != self._loop_thread)
        parts = []
        for ident in order:
            if ident == threading.get_ident():
                continue
            stack = traceback.extract_stack(frames[ident])[-4:]
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack[::-1])
            label = "loop" if ident == self._loop_thread else names.get(ident, str(ident))
            parts.append(f"  [{label}] {where}")
        return "\n".join(parts)


class LoopLagCollector(Collector):
    """`slogate_event_loop_lag_seconds`: the worst lag over the last 10 s, at scrape time."""

    WINDOW_S = 10.0

    def __init__(self, lag: LoopLag, clock: Callable[[], float]) -> None:
        self._lag = lag
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "slogate_event_loop_lag_seconds",
            "How late the sidecar's event loop ran at worst in the last 10 s (a starved "
            "sidecar: every decision and probe waits this long; probe timeouts during such "
            "a stall are not counted against the engines).",
            value=self._lag.worst_since(self._clock() - self.WINDOW_S),
        )
