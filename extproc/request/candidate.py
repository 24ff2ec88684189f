"""The candidate policy judged beside the enforced one on every request, never enforced.

What lives here: `CandidateJudge` (the Decider's `CandidatePolicy`: it wraps each request's
enforced admission, then judges the same request under the candidate in a task, off the
request's path), `verdict_of` (the comparison, pure) and `candidate_caller` (the caller as
the candidate knows it). What the candidate would have done is written on the request's
`CandidateNote` (admission.decision: the traffic record reads it) and reported through
`CandidateEvents` (extproc.service.candidate_metrics).

What the candidate judges: the policy's own checks, run by the same code with the same
errors — the caller (a key the candidate drops, a suspended tenant, a limit of 0), the
routing (pool and bucket), the model's window, the tenant's pools, and the key or tenant
budgets, in windows of its own (this process's, or `candidate:`-prefixed ones in the
fleet's Redis store: they count what the candidate would have admitted; a request both
admit is settled there with its real usage). It counts nothing twice: the prompt count is
the enforced one's, and the real budgets are never touched.
What it does not judge: the live state the two policies share — the breaker, KV room, the
waiting room, spend budgets; a request the enforced policy refused for one of those is
`same` without a look. Requests refused before they were routed (a bad body, over the
model's window, in the header phase: an unknown key, a suspended tenant) and the APIs
whose body is not read are not judged either.

Bounded: at most `max_pending` judgements wait for the loop; past that a request is
`skipped` (counted), never waited for. With its windows in this process, a refused request
is judged before its refusal goes out (no I/O), so that the traffic record, written when
the refusal is, carries the verdict; with them in Redis, in a task like the rest (no
round trip added to a refusal; its record may then be written before the verdict).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from admission.access import check_request
from admission.budget_step import BudgetStep, reserved_charge
from admission.decision import Applicant, CandidateNote, RequestOutcome, RoutingDecision
from admission.errors import (
    Forbidden,
    InvalidRequest,
    RequestRejected,
    Unauthenticated,
)
from admission.events import NoEvents
from budget.store import BudgetStore, InProcessStore
from extproc.request.identity import StoredKeys
from extproc.request.routing import route
from extproc.request.verdicts import CountedRequest, Routed
from policy.domain import ApiKey, build_caller
from policy.schema import Policy

log = logging.getLogger("slogate.candidate")

# The candidate's budget windows in a shared store: its ids under this prefix.
CANDIDATE_BUDGETS = "candidate:"


class Verdict(StrEnum):
    SAME = "same"
    WOULD_REFUSE = "would_refuse"  # enforced admitted it; the candidate would refuse it
    WOULD_ADMIT = "would_admit"  # enforced refused it; the candidate would admit it
    WOULD_ROUTE = "would_route"  # both admit it, to different pools
    SKIPPED = "skipped"  # too many judgements waiting: not judged


class CandidateEvents(Protocol):
    def candidate_verdict(
        self, tenant: str, verdict: str, reason: str, from_pool: str, to_pool: str
    ) -> None: ...


def verdict_of(enforced_pool: str | None, candidate_pool: str | None) -> Verdict:
    """Each side's pool, None where it refuses."""
    if enforced_pool is None:
        return Verdict.SAME if candidate_pool is None else Verdict.WOULD_ADMIT
    if candidate_pool is None:
        return Verdict.WOULD_REFUSE
    return Verdict.SAME if enforced_pool == candidate_pool else Verdict.WOULD_ROUTE


def judged_refusal(refused: RequestRejected) -> bool:
    """A refusal the candidate judges too: the policy's own (caller, window, pools, key
    budgets); not the shared live state's (breaker, KV room, waiting room, spend)."""
    return isinstance(refused, Forbidden | Unauthenticated | InvalidRequest) or (
        refused.reason.startswith("budget_")
    )


def candidate_caller(
    enforced: Policy, candidate: Policy, caller: ApiKey, keys: StoredKeys | None = None
) -> ApiKey:
    """The caller as the candidate knows it, looked up as the resolver does (a stored key
    before the policy's; a JWT caller from its tenant and tier); Unauthenticated where the
    candidate does not know the key."""
    if caller.from_jwt:
        return build_caller(
            caller.key_sha256,
            caller.tenant,
            caller.tier,
            {},
            candidate.tier_limits,
            candidate.tenants,
            from_jwt=True,
        )
    if keys is not None:
        stored = keys.caller(caller.key_sha256, candidate)
        if isinstance(stored, str):
            raise Unauthenticated("The candidate refuses this stored key.", reason=stored)
        if stored is not None:
            return stored
    known = candidate.keys.get(caller.key_sha256)
    if known is None:
        raise Unauthenticated("Incorrect API key provided.", reason="unknown_api_key")
    return known


@dataclass(frozen=True, slots=True)
class _Judging:
    """One request to judge under the candidate, as the enforced policy saw it. `key`: what
    the candidate reserves under (the tracking id; a refused request gets its own).
    `routed`: the enforced admission's answer; None when it refused."""

    key: str
    counted: CountedRequest
    policy: Policy  # the enforced one: the request's snapshot
    routed: Routed | None

    @property
    def decision(self) -> RoutingDecision:
        return self.counted.decision


class CandidateJudge:
    """The Decider's `CandidatePolicy`, and an OutcomeSink: a request both policies admitted is
    settled in the candidate's budgets with its real usage when it ends."""

    def __init__(
        self,
        candidate: Callable[[], Policy | None],
        events: CandidateEvents,
        ttl_s: float,
        keys: StoredKeys | None = None,
        clock: Callable[[], float] | None = None,
        max_pending: int = 1024,
        store: BudgetStore | None = None,
    ) -> None:
        """`store`: where the candidate's budget windows live, apart from the real ones
        (budget.prefixed_store over the fleet's Redis store); None: in this process."""
        self._candidate = candidate
        self._events = events
        self._keys = keys
        self.store: BudgetStore = store or InProcessStore(clock or time.time)
        self._local = store is None
        self._budget = BudgetStep(self.store, NoEvents(), ttl_s)
        self._max_pending = max_pending
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._held: dict[str, RoutingDecision] = {}  # tracking id -> the candidate's decision
        self._ids = itertools.count()
        # Ids of refused requests' reservations, unique across replicas sharing Redis.
        self._id_prefix = os.urandom(4).hex()

    @property
    def active(self) -> bool:
        return self._candidate() is not None

    def attach(self, decision: RoutingDecision) -> RoutingDecision:
        """The decision with an empty note, when a candidate is loaded."""
        if self._candidate() is None:
            return decision
        return dataclasses.replace(decision, candidate=CandidateNote())

    async def beside(
        self, enforced: Awaitable[Routed], counted: CountedRequest, policy: Policy
    ) -> Routed:
        """The enforced admission's answer, unchanged. The candidate judges an admitted
        request in a task, after the answer; a refused one before the refusal goes out
        when its windows are in this process (~0.07 ms, no I/O: its traffic record then
        carries the verdict), in a task too when they are in Redis."""
        try:
            routed = await enforced
        except RequestRejected as refused:
            key = f"candidate-{self._id_prefix}-{next(self._ids):x}"
            judging = self._judgement(_Judging(key, counted, policy, None), refused)
            if judging is not None and self._local:
                await judging
            elif judging is not None:
                self._in_task(key, judging)
            raise
        key = routed.tracking_id
        judging = self._judgement(_Judging(key, counted, policy, routed), None)
        if judging is not None:
            self._in_task(key, judging)
        return routed

    def _in_task(self, key: str, judging: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(judging)
        self._pending[key] = task
        task.add_done_callback(lambda _: self._pending.pop(key, None))

    def _judgement(
        self, judging: _Judging, refused: RequestRejected | None
    ) -> Coroutine[None, None, None] | None:
        """The candidate's judgement to run; None when there is nothing to judge (the note
        says why)."""
        candidate = self._candidate()
        note = judging.decision.candidate
        if candidate is None or note is None:
            return None
        tenant = judging.decision.caller.tenant_label
        if refused is not None and not judged_refusal(refused):
            note.verdict = Verdict.SAME
            self._events.candidate_verdict(tenant, note.verdict, "", "", "")
            return None
        admitted = judging.routed is not None
        if (admitted or not self._local) and len(self._pending) >= self._max_pending:
            note.verdict = Verdict.SKIPPED
            self._events.candidate_verdict(tenant, note.verdict, "", "", "")
            return None
        return self._judge(judging, candidate, note)

    async def _judge(self, judging: _Judging, candidate: Policy, note: CandidateNote) -> None:
        decision, routed = judging.decision, judging.routed
        try:
            judged = await self._admit(judging, candidate)
        except RequestRejected as refusal:
            note.reason = refusal.reason
            judged = None
        except Exception:  # a bug here must never reach a request
            log.exception("judging %s under the candidate failed", decision.request_id)
            return
        note.pool = judged.pool if judged is not None else ""
        verdict = verdict_of(decision.pool if routed is not None else None, note.pool or None)
        note.verdict = verdict
        if judged is not None and routed is None:  # nothing will run: keep what it reserved
            limits = judged.limits or judged.caller.limits
            await self.store.settle(
                judged.caller.budget_id, limits, judging.key, reserved_charge(judged)
            )
        self._events.candidate_verdict(
            decision.caller.tenant_label, verdict, note.reason, decision.pool, note.pool
        )

    async def _admit(self, judging: _Judging, candidate: Policy) -> RoutingDecision:
        decision, request, routed = judging.decision, judging.counted.request, judging.routed
        caller = candidate_caller(judging.policy, candidate, decision.caller, self._keys)
        if request.sequences > candidate.max_sequences:
            raise InvalidRequest("Too many sequences.", reason="too_many_sequences")
        judged = route(
            candidate, request, caller, decision.request_id, decision.api,
            judging.counted.counted, decision.prompt_correction,
        )  # fmt: skip
        if routed is not None:  # the breaker level it met scales the candidate's limits too
            judged = dataclasses.replace(judged, level=routed.decision.level)
        check_request(candidate, judged)
        admitted = await self._budget.admit(Applicant(judged, judging.key, candidate))
        if routed is not None:
            self._held[judging.key] = admitted.decision
        return admitted.decision

    def record(self, outcome: RequestOutcome) -> Awaitable[None] | None:
        """OutcomeSink: settle a request both admitted in the candidate's budgets; None when
        the candidate holds nothing of it (none loaded, or it did not admit it). In a task
        of its own when it waits: for its judgement still running, or for its budgets in
        Redis (their timeouts cancel the task they run in: never the caller's)."""
        tracking = outcome.tracking_id
        if tracking not in self._pending and tracking not in self._held:
            return None
        settling = self._settle(outcome)
        waits = tracking in self._pending or not self._local
        return asyncio.ensure_future(settling) if waits else settling

    async def _settle(self, outcome: RequestOutcome) -> None:
        pending = self._pending.get(outcome.tracking_id)
        if pending is not None:
            await asyncio.wait([pending], timeout=1.0)
        judged = self._held.pop(outcome.tracking_id, None)
        if judged is not None:
            await self._budget.settle(dataclasses.replace(outcome, decision=judged))

    async def drain(self) -> None:
        """Wait for every judgement in flight (tests, shutdown)."""
        while self._pending:
            await asyncio.wait(list(self._pending.values()))
