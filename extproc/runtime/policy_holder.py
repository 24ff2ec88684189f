"""The active policy: one frozen object, swapped atomically on reload.

What lives here: `PolicyHolder`. Readers call it (a request flow once, at its start); a
reload on file change, SIGHUP or the admin API replaces one reference. A new policy that
does not load, or that changes a setting read only at start (policy.START_ONLY_SETTINGS),
is refused as a whole and the running one stays, with the reason logged and counted.

A reload reads and builds the new policy in a worker thread (extproc.runtime.heap.off_loop)
and swaps it in one step on the event loop: a ten-thousand-key policy takes ~0.4 s to
build, and built on the loop it held every request that long (measured: 2,060 ms for one
request during a reload).
Reloads run one at a time; one asked for while another runs waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from extproc.runtime.heap import off_loop
from extproc.service.metrics import SidecarMetrics
from policy._reader import PolicyError
from policy.loader import load_policy
from policy.schema import Policy, start_only_changes

log = logging.getLogger("slogate.policy")


class PolicyHolder:
    def __init__(self, path: Path, metrics: SidecarMetrics) -> None:
        self.path = path
        self._metrics = metrics
        self._policy = load_policy(path)
        self._mtime_ns = self._stat()
        self._lock = asyncio.Lock()
        # Called with each policy swapped in, under the reload's lock (the candidate's holder);
        # what they answer (a candidate refused) is the reload's `notice`, its policy applied.
        self.on_reload: list[Callable[[Policy], Awaitable[str | None]]] = []
        self.notice: str | None = None
        metrics.policy_keys.set(len(self._policy.keys))

    def __call__(self) -> Policy:
        return self._policy

    def _stat(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return 0

    async def reload(self) -> bool:
        return await self.reload_error() is None

    async def reload_error(self) -> str | None:
        """Re-read the file; None when the new policy is active, else why it was refused."""
        async with self._lock:
            started = time.perf_counter()
            try:
                policy = await off_loop(load_policy, self.path)
            except (PolicyError, OSError) as error:
                return self._refuse(str(error))
            changed = start_only_changes(self._policy, policy)
            if changed:
                return self._refuse(
                    f"{', '.join(changed)}: only read when the sidecar starts; restart it to "
                    "change them (nothing of the new policy was applied)"
                )
            self._policy = policy  # the swap: one reference, on the loop
            self._metrics.policy_reloads("ok").inc()
            self._metrics.policy_keys.set(len(policy.keys))
            log.info(
                "policy reloaded from %s (%d keys) in %.1f ms",
                self.path,
                len(policy.keys),
                (time.perf_counter() - started) * 1000,
            )
            notices = [await listener(policy) for listener in self.on_reload]
            self.notice = "; ".join(n for n in notices if n) or None
            return None

    def _refuse(self, reason: str) -> str:
        self._metrics.policy_reloads("rejected").inc()
        log.error("policy reload refused, keeping the active policy: %s", reason)
        return reason

    async def reload_if_changed(self) -> bool:
        mtime = self._stat()
        if mtime == self._mtime_ns:
            return False
        self._mtime_ns = mtime
        return await self.reload()
