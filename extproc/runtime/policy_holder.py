"""The active policy: one frozen object, swapped atomically on reload.

What lives here: `PolicyHolder`. Readers call it (a request flow once, at its start); a
reload on file change, SIGHUP or the admin API replaces one reference. A new policy that
does not load, or that changes a setting read only at start (policy.START_ONLY_SETTINGS),
is refused as a whole and the running one stays, with the reason logged and counted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from extproc.service.metrics import SidecarMetrics
from policy import Policy, PolicyError, load_policy, start_only_changes

log = logging.getLogger("slogate.policy")


class PolicyHolder:
    def __init__(self, path: Path, metrics: SidecarMetrics) -> None:
        self.path = path
        self._metrics = metrics
        self._policy = load_policy(path)
        self._mtime_ns = self._stat()
        metrics.policy_keys.set(len(self._policy.keys))

    def __call__(self) -> Policy:
        return self._policy

    def _stat(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return 0

    def reload(self) -> bool:
        return self.reload_error() is None

    def reload_error(self) -> str | None:
        """Re-read the file; None when the new policy is active, else why it was refused."""
        try:
            policy = load_policy(self.path)
        except (PolicyError, OSError) as error:
            return self._refuse(str(error))
        changed = start_only_changes(self._policy, policy)
        if changed:
            return self._refuse(
                f"{', '.join(changed)}: only read when the sidecar starts; restart it to "
                "change them (nothing of the new policy was applied)"
            )
        self._policy = policy
        self._metrics.policy_reloads("ok").inc()
        self._metrics.policy_keys.set(len(policy.keys))
        log.info("policy reloaded from %s (%d keys)", self.path, len(policy.keys))
        return None

    def _refuse(self, reason: str) -> str:
        self._metrics.policy_reloads("rejected").inc()
        log.error("policy reload refused, keeping the active policy: %s", reason)
        return reason

    def reload_if_changed(self) -> bool:
        mtime = self._stat()
        if mtime == self._mtime_ns:
            return False
        self._mtime_ns = mtime
        return self.reload()
