"""Large structures built beside a running event loop, and the garbage collector.

What lives here: `freeze_at_start`, `off_loop` and `collector_paused`. Ten thousand stored
keys take ~65 ms to parse (a ten-thousand-key policy ~0.4 s to build, now in a process of
its own: extproc.runtime.policy_build): on the event loop that holds every request as long.
`off_loop` builds in a worker thread with the interpreter's switch interval cut to 0.5 ms
(the loop gets the GIL back within that each time it asks, instead of within 5 ms) and the
collector paused (a full collection set off by the build's tens of thousands of new
objects would walk them holding the GIL).

CPython's full collection walks every tracked object; the policy, the tokenizer and the
gRPC stack live as long as the process, and a walk over them ran on the event loop at
whichever request came next (measured: 20-50 ms a walk here). `slogate serve` freezes
them once started (`freeze_at_start`), and what `off_loop` builds is frozen as it is
returned: frozen objects are left out of every collection and are still freed by
reference counting when a reload drops them. `collector_paused` does the same for what is
built on the loop itself in slices (a policy built in another process, installed piece by
piece). A sidecar built inside another process (tests, benchmarks) leaves that process's
collector as it is.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

BUILD_SWITCH_INTERVAL_S = 0.0005

_frozen = False
_lock = threading.Lock()
_building = 0  # builds under way: the first pauses the collector, the last restarts it
_shortened = 0  # those in threads: the first sets the short interval, the last restores it
_switch_interval_s = 0.005
_collector_was_enabled = True


def freeze_at_start() -> None:
    """Collect once (nothing is in flight yet: no garbage gets frozen), then freeze."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True


async def off_loop(build: Callable[..., T], *args: object) -> T:
    """`build(*args)` in a worker thread, as the module says; raises what it raises."""
    return await asyncio.to_thread(_build, build, *args)


def _build(build: Callable[..., T], *args: object) -> T:
    _begin(short_interval=True)
    try:
        return build(*args)
    finally:
        _end(short_interval=True)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector paused while a large structure is built on the loop (across awaits,
    in slices), what was built frozen after (in a sidecar process), as for `off_loop`."""
    _begin(short_interval=False)
    try:
        yield
    finally:
        _end(short_interval=False)


def _begin(short_interval: bool) -> None:
    global _building, _shortened, _switch_interval_s, _collector_was_enabled
    with _lock:
        if _building == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _building += 1
        if short_interval:
            if _shortened == 0:
                _switch_interval_s = sys.getswitchinterval()
                sys.setswitchinterval(BUILD_SWITCH_INTERVAL_S)
            _shortened += 1


def _end(short_interval: bool) -> None:
    """The last build out: what was built is frozen (in a sidecar process), then the
    collector and the interval are back. Collected first: a freeze keeps whatever is
    tracked at that moment, and cyclic garbage of the requests in flight (a reload runs
    under traffic) would stay in the permanent generation for good — measured before:
    ~260 objects a reload, `slogate bench reloads`. Only what is not frozen yet is walked:
    what came since the last freeze."""
    global _building, _shortened
    with _lock:
        _building -= 1
        if _building == 0:
            if _frozen:
                gc.collect()
                gc.freeze()
            if _collector_was_enabled:
                gc.enable()
        if short_interval:
            _shortened -= 1
            if _shortened == 0:
                sys.setswitchinterval(_switch_interval_s)
