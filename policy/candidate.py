"""The candidate policy: a second policy file evaluated beside the enforced one, never enforced.

What lives here: `candidate_path`, `load_candidate` and `checked_candidate`. A policy names
its candidate with `candidate: {file: candidate.yaml}` (relative to the policy file's
folder); the candidate is a whole policy, read and validated like one, with two more rules:
- it names no candidate of its own (one level: what would be promoted is that file);
- it changes no start-only setting (policy.start_only.START_ONLY_SETTINGS): those are read
  once at the sidecar's start, so a candidate that changes them could neither be evaluated
  as written nor promoted by a reload. It is refused, with the settings named.
The sidecar (extproc.runtime.candidate_holder) loads it after every load of the policy;
a candidate that does not load is refused alone: the enforced policy applies regardless.
"""

from __future__ import annotations

from pathlib import Path

from policy._reader import PolicyError
from policy.loader import load_policy
from policy.schema import Policy
from policy.start_only import start_only_changes


def candidate_path(policy: Policy) -> Path | None:
    """The candidate file `policy` names, resolved against its own folder; None: none."""
    if policy.candidate is None:
        return None
    named = Path(policy.candidate.file)
    if named.is_absolute() or policy.source.startswith("<"):
        return named
    return Path(policy.source).parent / named


def load_candidate(policy: Policy) -> Policy | None:
    """The candidate `policy` names, loaded and checked; None when it names none.
    Raises PolicyError (the message starts with the candidate's path) or OSError."""
    path = candidate_path(policy)
    if path is None:
        return None
    return checked_candidate(policy, path)


def checked_candidate(policy: Policy, path: Path) -> Policy:
    """The policy file at `path`, loaded and checked as a candidate to `policy`."""
    try:
        candidate = load_policy(path)
    except PolicyError as error:
        raise PolicyError(f"candidate {path}: {error}") from None
    if candidate.candidate is not None:
        raise PolicyError(f"candidate {path}: candidate: a candidate names no candidate")
    changed = start_only_changes(policy, candidate)
    if changed:
        raise PolicyError(
            f"candidate {path}: {', '.join(changed)}: differ from the policy; these are only "
            "read when the sidecar starts, so a candidate may not change them"
        )
    return candidate
