"""One sidecar replica as the simulator runs it: the sidecar's own decision code, driven on
the virtual clock.

What lives here: `SimulatedSidecar` — the sidecar's `Decider` (prompt counter, routing,
the model maximum) in front of the admission chain built by `admission.assembly`, exactly
as `extproc.runtime.sidecar` builds them — and `run_now`, which drives an admission
coroutine to its end without an event loop. Only what is really different is here: the
clock is virtual, prompts come from arrivals (their texts from sim.prompts, counted by the
real counter) instead of request bodies, and the outcome of each request comes from a
simulated engine instead of Envoy's access log.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from admission.assembly import Admission, build_admission
from admission.decision import RequestOutcome
from admission.errors import RequestRejected
from admission.events import NoEvents
from breaker.board import BreakerBoard
from budget.store import BudgetStore
from extproc.request.bodies import InferenceRequest
from extproc.request.flow import Decider, Routed
from extproc.request.inflight import InFlight
from extproc.request.tokens import PromptCounter
from policy import ApiKey, Policy
from policy.apis import KNOWN_APIS, BodyShape

T = TypeVar("T")
_CHAT = KNOWN_APIS[0]
# What a refusal's reason says about where it came from, for the simulator's results.
_OUTCOMES = (
    ("shed_", "shed"),
    ("kv_cache_full", "kv_full"),
    ("sequences_full", "kv_full"),
    ("budget_", "budget"),
    ("key_context_limit", "budget"),
)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Drive `coroutine` to its end at once. The simulator's admission never waits: the
    in-process budget store and inline counting have nothing to wait for. If a step ever
    does, that is a simulator bug, and it says so instead of inventing a result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("an admission step waited on I/O inside the simulator")


class _NoIdentity:
    """Simulated arrivals carry their key; nothing is resolved from headers."""

    def resolve(self, headers: Any, claims: Any = None, policy: Any = None) -> ApiKey:
        raise NotImplementedError


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
    ) -> None:
        self.policy = policy
        ttl_s = policy.upstream_timeout_s + 60.0
        self.admission: Admission = build_admission(
            board=board,
            store=store,
            events=NoEvents(),
            clock=clock,
            ttl_s=ttl_s,
            multipliers=multipliers,
            rng=rng,
        )
        self.decider = Decider(
            lambda: policy,
            _NoIdentity(),
            counter,
            admission=self.admission.chain,
            inflight=InFlight(clock, ttl_s),
        )

    def attempt(
        self, key: ApiKey, texts: tuple[str, ...], max_tokens: int, stream: bool, request_id: str
    ) -> Routed | RequestRejected:
        """The request (a chat of `texts`) as the sidecar decides it: admitted, or the
        refusal the client would get."""
        request = InferenceRequest(
            shape=BodyShape.CHAT,
            model=None,
            prompt_texts=texts,
            prompt_token_ids=0,
            max_tokens=max_tokens,
            stream=stream,
        )
        try:
            return run_now(self.decider.decide(request, key, request_id, _CHAT, self.policy))
        except RequestRejected as refusal:
            return refusal

    def decide(
        self, key: ApiKey, texts: tuple[str, ...], max_tokens: int, stream: bool, request_id: str
    ) -> Routed | str:
        """`attempt`, with a refusal told by its kind (shed, kv_full, budget, refused)."""
        decided = self.attempt(key, texts, max_tokens, stream, request_id)
        if isinstance(decided, Routed):
            return decided
        return next(
            (kind for prefix, kind in _OUTCOMES if decided.reason.startswith(prefix)),
            "refused",
        )

    def finish(self, outcome: RequestOutcome) -> None:
        """The request ended: out of the in-flight table, settled by every step."""
        self.decider.inflight.pop(outcome.tracking_id)
        run_now(self.admission.chain.record(outcome))
