"""One sidecar replica as the simulator runs it: the sidecar's own decision code, driven on
the virtual clock.

What lives here: `SimulatedSidecar` — the sidecar's `Decider` (prompt counter, routing,
the model maximum) in front of the admission chain built by `admission.assembly`, exactly
as `extproc.runtime.sidecar` builds them — and `run_now`, which drives an admission
coroutine to its end without an event loop. Only what is really different is here: the
clock is virtual, prompts come from arrivals (their texts from sim.fleet.prompts, counted by the
real counter) instead of request bodies, and the outcome of each request comes from a
simulated engine instead of Envoy's access log.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar

from admission.assembly import AssembledChain, build_admission, expiry_s
from admission.budget_step import KeyCeilings
from admission.crossing import Crossing
from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import RequestRejected
from admission.events import NoEvents
from admission.kv.book import KvBook
from admission.regions import RegionShares
from breaker.board import BreakerBoard
from budget.key_quotas import KeyQuotas
from budget.ledger import Charge
from budget.region_demand import RegionDemand
from budget.store import BudgetStore
from engines.picker import EnginePicker
from engines.state import EngineFleet
from extproc.request.bodies.request import InferenceRequest
from extproc.request.crossing_token import CrossingDesk
from extproc.request.engine_outcomes import EngineOutcomes
from extproc.request.flow import Decider
from extproc.request.inflight import InFlight
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.verdicts import Routed
from policy.apis import KNOWN_APIS, BodyShape
from policy.domain import ApiKey
from policy.schema import Policy

T = TypeVar("T")
_CHAT = KNOWN_APIS[0]
# What a refusal's reason says about where it came from, for the simulator's results.
_OUTCOMES = (
    ("shed_", "shed"),
    ("kv_cache_full", "kv_full"),
    ("sequences_full", "kv_full"),
    ("queue_full", "queue_full"),
    ("queue_timeout", "queue_timeout"),
    ("budget_", "budget"),
    ("key_context_limit", "budget"),
)


def refusal_kind(reason: str) -> str:
    """A refusal reason (`x-slogate-reason`) told by its kind, as the offline fleet counts
    its outcomes: shed, kv_full, queue_full, queue_timeout, budget, or refused."""
    return next((kind for prefix, kind in _OUTCOMES if reason.startswith(prefix)), "refused")


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Drive `coroutine` to its end at once, for what never waits: settling, and attempts
    without a waiting room. If it does wait, that is a simulator bug, and it says so
    instead of inventing a result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("an admission step waited inside the simulator")


class SimWaiter:
    """What a waiting admission awaits in the simulator: the waiting room's waiter on the
    virtual clock. Resolving it schedules the admission to resume (at the same virtual
    time, after the event that resolved it), as asyncio does with a future's callbacks."""

    __slots__ = ("_done", "_error", "_schedule", "resume")

    def __init__(self, schedule: Callable[[Callable[[], None]], None]) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._schedule = schedule
        self.resume: Callable[[], None] | None = None  # set by `drive` when it suspends

    def done(self) -> bool:
        return self._done

    def set_result(self, result: None, /) -> None:
        self._wake(None)

    def set_exception(self, exception: BaseException, /) -> None:
        self._wake(exception)

    def _wake(self, error: BaseException | None) -> None:
        if self._done:
            raise RuntimeError("a waiter resolved twice")
        self._done, self._error = True, error
        if self.resume is not None:
            self._schedule(self.resume)

    def __await__(self) -> Generator[SimWaiter, None, None]:
        if not self._done:
            yield self  # the driver suspends here until the room resolves it
        if self._error is not None:
            raise self._error


def drive(
    coroutine: Coroutine[Any, Any, T], on_done: Callable[[T | RequestRejected], None]
) -> None:
    """Run an admission coroutine as far as it goes; when it waits on a SimWaiter, go on
    when the waiter is resolved. `on_done` gets its result or its refusal."""
    try:
        waiter = coroutine.send(None)
    except StopIteration as done:
        on_done(done.value)
        return
    except RequestRejected as refusal:
        on_done(refusal)
        return
    if not isinstance(waiter, SimWaiter):
        coroutine.close()
        raise RuntimeError(f"an admission step waited on {waiter!r} inside the simulator")
    # It yielded only because it was not resolved yet (SimWaiter.__await__).
    waiter.resume = lambda: drive(coroutine, on_done)


class _NoIdentity:
    """Simulated arrivals carry their key; nothing is resolved from headers."""

    def resolve(self, headers: Any, claims: Any, policy: Any) -> ApiKey:
        raise NotImplementedError


class SettledToKeyQuotas(NoEvents):
    """The one event the simulator listens to: settled tokens, into the per-key dynamic
    budgets (as the sidecar's MetricsEvents does)."""

    def __init__(self, key_quotas: KeyQuotas) -> None:
        self._key_quotas = key_quotas

    def tokens_settled(self, decision: RoutingDecision, charge: Charge) -> None:
        self._key_quotas.observe(decision.caller.budget_id, charge.weighted_tokens)


class SimulatedSidecar:
    def __init__(
        self,
        policy: Policy,
        board: BreakerBoard | None,
        store: BudgetStore | None,
        counter: PromptCounter,
        clock: Callable[[], float],
        multipliers: Mapping[str, float],
        rng: random.Random,
        schedule: Callable[[Callable[[], None]], None] | None = None,
        book: KvBook | None = None,
        engines: Mapping[str, Sequence[str]] | None = None,
        key_quotas: KeyQuotas | None = None,
        ceilings: KeyCeilings | None = None,
        shares: RegionShares | None = None,
        demand: RegionDemand | None = None,
        crossing: Crossing | None = None,
        desk: CrossingDesk | None = None,
    ) -> None:
        """`schedule`: how a resumed admission is put on the virtual clock's queue; None:
        no waiting room (a full pool refuses at once). `book`: the KV ledger, shared by the
        fleet's sidecars (None: this sidecar's own, against its part of each pool).
        `engines`: each pool's engine addresses: this replica's own view of them (their
        state, what it holds on each, its prefix index) and the sidecar's picker over it.
        `key_quotas`: the per-key dynamic budgets its settlements feed; `ceilings`: what
        its budget step caps keys at (enforced as `breaker.controller_key_budgets` says).
        `shares`: its region's share of each global tenant (sim.fleet.regions; None: one
        region); `demand`: where its budget step counts the global tenants' demand and
        usage for the region's report; `crossing`: where its saturated pools' tolerant
        requests may go (admission.crossing), `desk`: the crossing tokens it mints for them
        and verifies on requests that come from a peer (None: nothing crosses)."""
        self.policy = policy
        ttl_s = expiry_s(policy)
        self.fleet = EngineFleet(
            lambda: policy.engines.health,
            clock,
            lambda: policy.breaker.stale_after_s,
            lambda: policy.breaker.window_s,
        )
        for pool, addresses in (engines or {}).items():
            self.fleet.sync(pool, [_host_port(a) for a in addresses])
        self.picker = EnginePicker(
            self.fleet, lambda: policy, clock, lambda: policy.breaker.stale_after_s
        )
        self._engine_outcomes = EngineOutcomes(self.picker)
        new_waiter = None if schedule is None else (lambda: SimWaiter(schedule))
        self.admission: AssembledChain = build_admission(
            board=board,
            store=store,
            events=NoEvents() if key_quotas is None else SettledToKeyQuotas(key_quotas),
            clock=clock,
            ttl_s=ttl_s,
            multipliers=multipliers,
            ceilings=ceilings,
            rng=rng,
            policy=lambda: policy,
            new_waiter=new_waiter,
            book=book,
            wait_cap_s=policy.longest_wait_s,
            live=self.fleet.live_pool,
            largest_engine=self.fleet.largest_kv_tokens,
            shares=shares,
            demand=demand,
            crossing=crossing,
        )
        self.decider = Decider(
            lambda: policy,
            _NoIdentity(),
            counter,
            admission=self.admission.chain,
            inflight=InFlight(clock, ttl_s),
            picker=self.picker if engines else None,
            crossing=desk,
        )

    async def _decide(
        self,
        key: ApiKey,
        request: InferenceRequest,
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> Routed:
        counted = await self.decider.count_and_route(request, key, request_id, _CHAT, self.policy)
        desk = self.decider.crossing
        if headers and desk is not None:
            # A request from a peer region: its token read as RequestFlow reads it (charged
            # at its origin when verified; never sent on either way).
            arrival = desk.arrival(headers, self.policy.regions)
            arrived = dataclasses.replace(
                counted.decision, crossed_from=arrival.crossed_from, may_cross=arrival.may_cross
            )
            counted = dataclasses.replace(counted, decision=arrived)
        return await self.decider.admit_counted(counted, self.policy)

    def attempt(
        self, key: ApiKey, request: InferenceRequest, request_id: str
    ) -> Routed | RequestRejected:
        """The request (a `chat`) as the sidecar decides it, at once: admitted, or the
        refusal the client would get (a sidecar without a waiting room)."""
        try:
            return run_now(self._decide(key, request, request_id))
        except RequestRejected as refusal:
            return refusal

    def submit(
        self,
        key: ApiKey,
        request: InferenceRequest,
        request_id: str,
        on_done: Callable[[Routed | RequestRejected], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """The request (a `chat`) as the sidecar decides it, waiting in the waiting room if
        it must: `on_done` gets the decision when it is made (now, or when the room
        dispatches or times it out). `headers`: those it came with from a peer region (its
        crossing token)."""
        drive(self._decide(key, request, request_id, headers), on_done)

    @staticmethod
    def kind(refusal: RequestRejected) -> str:
        """A refusal told by its kind (shed, kv_full, queue_full, budget, refused)."""
        return refusal_kind(refusal.reason)

    def finish(self, outcome: RequestOutcome) -> None:
        """The request ended: out of the in-flight table, settled by every step, its engine's
        hold freed and its answer counted for or against that engine."""
        self.decider.inflight.pop(outcome.tracking_id)
        run_now(self.admission.chain.settle(outcome))
        self._engine_outcomes.record(outcome)


def chat(
    texts: tuple[str, ...],
    max_tokens: int,
    stream: bool,
    head: int = 1,
    roles: tuple[str, ...] = (),
) -> InferenceRequest:
    """A chat of `texts` as the sidecar parses one. `head`: the leading texts that are its
    conversation's head; `roles`: each text's role (a plain chat's; empty: not known)."""
    return InferenceRequest(
        shape=BodyShape.CHAT,
        model=None,
        prompt_texts=texts,
        prompt_token_ids=0,
        max_tokens=max_tokens,
        stream=stream,
        conversation_texts=head,
        chat_roles=roles,
    )


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)
