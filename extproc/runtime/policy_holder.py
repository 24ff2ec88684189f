"""The active policy: one frozen object, swapped atomically on reload.

What lives here: `PolicyHolder`. Readers call it (a request flow once, at its start); a
reload on file change, SIGHUP or the admin API replaces one reference. A new policy that
does not load, or that changes a setting read only at start
(policy.start_only.START_ONLY_SETTINGS), is refused as a whole and the running one stays,
with the reason logged and counted.

A reload builds the new policy in the builder process (extproc.runtime.policy_build),
which sends back only what changed, and swaps it in in one step on the event loop: a
ten-thousand-key policy takes ~0.4 s of CPU to build; built on the loop it held every
request that long (measured: 2,060 ms for one request during a reload), and built in a
thread beside the loop it still took the interpreter lock from it (asked to wake every
1 ms, the loop went up to 60 ms between wakes; 9 ms with the builder:
bench/results/tenants.md). The holder keeps the digest of the text the running policy was
built from, which names it to the builder (and the text itself until the builder has it).
Reloads run one at a time; one asked for while another runs waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from extproc.runtime.policy_build import BuildFailed, build_elsewhere, text_digest
from extproc.service.metrics import SidecarMetrics
from policy._reader import PolicyError
from policy.loader import policy_from_text, read_policy_text
from policy.schema import Policy
from policy.start_only import start_only_changes

log = logging.getLogger("slogate.policy")


class PolicyHolder:
    def __init__(self, path: Path, metrics: SidecarMetrics) -> None:
        self.path = path
        self._metrics = metrics
        self._mtime_ns = self._stat()
        text = read_policy_text(path)
        self._policy = policy_from_text(text, str(path))
        # What names the running policy's text to the builder process, and the text itself
        # until the builder has built it once (extproc.runtime.policy_build).
        self._digest = text_digest(str(path), text)
        self._text: str | None = text
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
            # Stat before reading: the file watcher leaves this version alone (a SIGHUP
            # after an edit is one reload, not two) and still sees a later edit.
            self._mtime_ns = self._stat()
            try:
                built = await build_elsewhere(
                    str(self.path), self._policy, self._digest, self._text
                )
                self._text = None  # the builder keeps it from now on
            except (PolicyError, OSError, BuildFailed) as error:
                return self._refuse(str(error))
            policy = built.policy
            changed = start_only_changes(self._policy, policy)
            if changed:
                return self._refuse(
                    f"{', '.join(changed)}: only read when the sidecar starts; restart it to "
                    "change them (nothing of the new policy was applied)"
                )
            self._policy, self._digest = policy, built.digest  # the swap: on the loop
            self._metrics.policy_reloads("ok").inc()
            self._metrics.policy_keys.set(len(policy.keys))
            log.info(
                "policy reloaded from %s (%d keys; %d keys and tenants built anew, %d kept) "
                "in %.1f ms",
                self.path,
                len(policy.keys),
                built.rebuilt,
                built.reused,
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
        if self._stat() == self._mtime_ns:
            return False
        return await self.reload()
