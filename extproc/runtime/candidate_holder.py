"""The candidate policy the sidecar judges beside the enforced one (policy.candidate).

What lives here: `CandidateHolder`. It loads the candidate the policy names when the
sidecar starts, after every policy reload (PolicyHolder.on_reload) and when the candidate's
own file changes (`reload_if_changed`, from the sidecar's watch loop); reads are one
reference (`holder()`, None: no candidate). A candidate that does not load is refused alone,
its reason logged, kept in `error` and counted: the enforced policy applies regardless, and
the candidate running before stays (as a refused policy reload keeps the running policy);
a policy that names no candidate clears it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from extproc.runtime.heap import off_loop
from extproc.runtime.policy_holder import PolicyHolder
from policy._reader import PolicyError
from policy.candidate import candidate_path, load_candidate
from policy.schema import Policy

log = logging.getLogger("slogate.candidate")


class LoadEvents(Protocol):
    """What the holder reports (extproc.service.candidate_metrics.CandidateMetrics)."""

    def candidate_loaded(self, active: bool, ok: bool) -> None: ...


class _Unreported:
    def candidate_loaded(self, active: bool, ok: bool) -> None:
        pass


class CandidateHolder:
    def __init__(self, policy: PolicyHolder, events: LoadEvents | None = None) -> None:
        self._policy = policy
        self._events: LoadEvents = events or _Unreported()
        self._candidate: Policy | None = None
        self._path: Path | None = None
        self._mtime_ns = 0
        self.error: str | None = None
        self._load(policy())
        policy.on_reload.append(self.reload)

    def __call__(self) -> Policy | None:
        return self._candidate

    def _load(self, policy: Policy) -> None:
        self._remember(policy)
        try:
            self._take(load_candidate(policy))
        except (PolicyError, OSError) as error:
            self._refuse(str(error))

    def _remember(self, policy: Policy) -> None:
        self._path = candidate_path(policy)
        self._mtime_ns = self._stat()

    def _stat(self) -> int:
        try:
            return self._path.stat().st_mtime_ns if self._path is not None else 0
        except OSError:
            return 0

    def _take(self, candidate: Policy | None) -> None:
        self._candidate = candidate
        self.error = None
        self._events.candidate_loaded(candidate is not None, True)
        if candidate is not None:
            log.info("candidate policy %s loaded: judged beside the policy", candidate.source)

    def _refuse(self, reason: str) -> None:
        self.error = reason
        self._events.candidate_loaded(self._candidate is not None, False)
        log.error("candidate policy refused (the policy applies regardless): %s", reason)

    async def reload(self, policy: Policy) -> str | None:
        """The policy was reloaded: load the candidate it names; why it was refused, if it
        was (the reload's notice: `slogate reload` prints it)."""
        self._remember(policy)
        if self._path is None:
            self._take(None)
            return None
        try:
            self._take(await off_loop(load_candidate, policy))
        except (PolicyError, OSError) as error:
            self._refuse(str(error))
            return f"the candidate was refused (the policy applies): {error}"
        return None

    async def reload_if_changed(self) -> bool:
        """The candidate's own file changed: reload it; True when it was looked at."""
        if self._path is None or self._stat() == self._mtime_ns:
            return False
        await self.reload(self._policy())
        return True
