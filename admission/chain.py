"""The admission chain: every step a request must pass before it reaches a pool.

What lives here: the `Step` protocol (admit an `Applicant`, release, settle) and
`AdmissionChain`, which runs the steps in order and is itself the outcome sink that settles
them when a request ends. The sidecar and the simulator run the same chain
(admission.assembly builds it); neither knows a step's kind, and nothing is looked up with
hasattr.

Rules the chain keeps:
- A step admits (maybe re-routing or annotating the decision: the level it met, the limits
  it reserved under) or raises a `RequestRejected`.
- Whatever ends the admission early — a refusal, a bug in a later step, or the request
  being cancelled while a step awaits (Envoy timing out, the client resetting) — the steps
  that already admitted give back what they hold, last first. Nothing leaks.
- An admitted request that will not run after all is released the same way (`release`).
- When the request ends (its access-log entry, or its expiry), every step settles it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

from admission.decision import Admitted, Applicant, RequestOutcome, RoutingDecision

log = logging.getLogger("slogate.admission")


class Step(Protocol):
    async def admit(self, applicant: Applicant) -> Admitted:
        """Admit (maybe changing the decision) or raise a RequestRejected."""
        ...

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """Give back what admit took, because the request will not run."""
        ...

    async def settle(self, outcome: RequestOutcome) -> None:
        """The request ended: settle what admit took with what it really used."""
        ...


class OutcomeSink(Protocol):
    """Something that needs each finished request (the chain, the engine picker, the
    decision log, ...).

    `record` takes the outcome at once, on the task that saw the request end (the access-log
    stream's, an ext_proc stream's), and must not wait there: most sinks are done when it
    returns (metrics, tables in this process, a queue to a writer thread) and return None.
    What is left is returned for the caller to await, on its own task, each in turn after
    every sink took the outcome: work that is async only in form (a settlement against this
    process's stores never waits) as a coroutine; work that waits (a store's round trip,
    another task) as a task of its own (`asyncio.ensure_future`), so a batch's round trips
    run concurrently and nothing reads the caller's task (asyncio.timeout, redis-py's
    blocking pool would cancel it on expiry)."""

    def record(self, outcome: RequestOutcome) -> Awaitable[None] | None: ...


class AdmissionChain:
    def __init__(self, steps: Sequence[Step], settle_apart: bool = False) -> None:
        """`settle_apart`: the steps' stores are shared (Redis), whose round trips are
        bounded with asyncio.timeout, which cancels the task it runs in on expiry: each
        settlement then runs in a task of its own, never on the caller's (the access-log
        stream). In this process settling never waits and runs where it is awaited."""
        self.steps = tuple(steps)
        self._settle_apart = settle_apart

    async def admit(self, applicant: Applicant) -> Admitted:
        """Each step in turn is handed the applicant with the decision as the steps before
        it left it."""
        headers: dict[str, str] = {}
        held: list[tuple[Step, RoutingDecision]] = []
        try:
            for step in self.steps:
                admitted = await step.admit(applicant)
                if admitted.decision is not applicant.decision:  # most steps change nothing
                    applicant = dataclasses.replace(applicant, decision=admitted.decision)
                headers.update(admitted.response_headers)
                held.append((step, admitted.decision))
        except BaseException:
            await self._give_back(held, applicant.request_id)
            raise
        return Admitted(applicant.decision, headers)

    async def release(self, decision: RoutingDecision, request_id: str) -> None:
        """Give back everything an admitted request holds, because it will not run after
        all (no endpoint it may go to was left once it was admitted): each step, last first."""
        await self._give_back([(step, decision) for step in self.steps], request_id)

    async def _give_back(self, held: list[tuple[Step, RoutingDecision]], request_id: str) -> None:
        for step, decision in reversed(held):
            try:
                await step.release(decision, request_id)
            except Exception:  # the others must still give back theirs
                log.exception("releasing %s from %r failed", request_id, step)

    def record(self, outcome: RequestOutcome) -> Awaitable[None]:
        """OutcomeSink: the request's settlement in every step, for the caller to await."""
        settling = self.settle(outcome)
        return asyncio.ensure_future(settling) if self._settle_apart else settling

    async def settle(self, outcome: RequestOutcome) -> None:
        """Settle the request in every step (each failure logged, not fatal)."""
        for step in self.steps:
            try:
                await step.settle(outcome)
            except Exception:
                log.exception("settling %s in %r failed", outcome.tracking_id, step)
