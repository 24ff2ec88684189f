"""The admission chain as the sidecar runs it, built in one place for the sidecar and the
simulator alike.

What lives here: `AssembledChain` (the chain and its steps, for the callers that also drive the
steps' own loops: the KV ratio, expiry, the waiting room) and `build_admission`. The
order is the rule: the access check first (a tenant suspended, a limit of 0, a pool its
tenant may not use: a 403 before anything is shed or spent; admission.access), the breaker
(a shed request spends nothing), the budget next (a
contract: refused at once, never after a wait), the tenant's spend budget after the key's
(refused at once too), KV admission last, where a request may
wait for room (admission.waiting_room) holding its budget reservation, which is given back
if it leaves without running. A simulated run may leave the breaker or the budgets out; it
never reorders or re-implements a step.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from admission.access import AccessStep
from admission.breaker_step import BreakerStep
from admission.budget_step import BudgetStep, KeyCeilings
from admission.chain import AdmissionChain, Step
from admission.crossing import Crossing
from admission.events import BreakerEvents, BudgetEvents, KvEvents
from admission.kv.book import KvBook
from admission.kv.step import KvStep
from admission.regions import RegionShares
from admission.spend_step import SpendEvents, SpendStep
from admission.waiting_room import Waiter
from breaker.board import BreakerBoard
from budget.region_demand import RegionDemand
from budget.spend_store import SpendStore
from budget.store import BudgetStore
from policy.domain import Pool
from policy.schema import Policy


class Events(BreakerEvents, KvEvents, BudgetEvents, Protocol):
    """Everything the standard chain reports (admission.events)."""


@dataclass(frozen=True, slots=True)
class AssembledChain:
    chain: AdmissionChain
    kv: KvStep
    breaker: BreakerStep | None
    budget: BudgetStep | None
    spend: SpendStep | None = None


def expiry_s(policy: Policy) -> float:
    """How long a request's reservation, KV hold and in-flight entry live before they are
    taken as lost: its upstream timeout (no request runs longer: Envoy's route timeout)
    plus time for its access-log entry to arrive — the timeout again, between 5 s and a
    minute. A lost KV hold keeps capacity from the whole fleet until then (a replica killed
    while holding)."""
    upstream_s = policy.upstream_timeout_s
    return upstream_s + min(60.0, max(5.0, upstream_s))


def build_admission(
    *,
    board: BreakerBoard | None,
    store: BudgetStore | None,
    events: Events,
    clock: Callable[[], float],
    ttl_s: float,
    multipliers: Mapping[str, float] | None = None,
    ceilings: KeyCeilings | None = None,
    rng: random.Random | None = None,
    book: KvBook | None = None,
    policy: Callable[[], Policy],
    new_waiter: Callable[[], Waiter] | None = None,
    wait_cap_s: float = math.inf,
    live: Callable[[Pool], Pool] | None = None,
    largest_engine: Callable[[Pool], float | None] | None = None,
    spend: tuple[SpendStore, SpendEvents] | None = None,
    wall_clock: Callable[[], float] = time.time,
    shares: RegionShares | None = None,
    demand: RegionDemand | None = None,
    crossing: Crossing | None = None,
    settle_apart: bool = False,
) -> AssembledChain:
    """`board` None: no breaker step; `store` None: no budget step (simulated runs only);
    `new_waiter` None: no waiting room (a full pool refuses at once); `book`: where the KV
    ledger lives (None: this process's own; admission.kv.book); `live`: a pool as its serving
    engines make it (engines.state.EngineFleet.live_pool; None: as the policy says);
    `largest_engine`: the KV cache of its largest serving engine (EngineFleet.
    largest_kv_tokens; None: not checked);
    `spend`: the tenants' spend budgets' store and events (None: no spend step), the step
    right after the key budgets, `wall_clock` telling it the UTC day and month;
    `shares`: this region's share of each global tenant's limits and spend (None: one
    region), `demand`: where the budget step counts the global tenants' demand and usage;
    `crossing`: where saturated pools' tolerant requests may go to another region (the
    breaker step asks it at the crossing level, the KV step where it would refuse for want
    of room; None: nothing crosses); `settle_apart`: the stores are shared (Redis), so each
    settlement runs in a task of its own (admission.chain.AdmissionChain)."""
    breaker = BreakerStep(board, events, rng, crossing) if board is not None else None
    budget = (
        BudgetStep(store, events, ttl_s, multipliers, ceilings, shares, demand)
        if store is not None
        else None
    )
    spending = SpendStep(*spend, ttl_s, wall_clock, shares) if spend is not None else None
    kv = KvStep(events, clock, ttl_s, policy, new_waiter, book, wait_cap_s, live, largest_engine)
    kv.crossing = crossing
    chosen = (AccessStep(), breaker, budget, spending, kv)
    steps: list[Step] = [s for s in chosen if s is not None]
    return AssembledChain(AdmissionChain(steps, settle_apart), kv, breaker, budget, spending)
