"""A discrete-event fleet on a virtual clock that runs slogate's REAL decision code.

What lives here: `OfflineFleet`, which plays a workload (arrivals of (time, key, prompt,
max_tokens)) through one or more simulated sidecar replicas (sim.fleet.sidecar: the sidecar's own
Decider, prompt counter and admission chain) into simulated engines (sim.server.model's KV cache
and latency model, one per pool), and feeds what the engines did back the way the access
log does: the same signals into the breaker (admission.signals), the same settlement in
every admission step. Nothing is copied; only the clock, the engines and the arrivals are
the simulator's own. One simulated hour runs in seconds.

The fleet's state and its event loop (arrivals, the breaker's evaluations, the controller,
scrapes, probes, outages, the waiting room's tick) are here; what happens to a request once
a sidecar decided it (its engine, its latencies, its end) is sim.fleet.fleet_requests'.

Each request draws its latencies from its own random generator seeded by (seed, its arrival
time and prompt), so two runs that differ only in another tenant's traffic give a tenant's requests
the same draws: differences come from interference, not from reshuffled randomness.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from admission.crossing import Crossing
from admission.kv.book import LocalBook
from admission.kv.dispatch import ROOM_TICK_S
from admission.regions import RegionShares
from breaker.board import BreakerBoard
from breaker.latency import ResponseWindows
from budget.ahead import AheadCeilings, AheadPlanner, tenant_tiers
from budget.key_quotas import KeyQuotas
from budget.quotas import Adjustment, TierMultipliers
from budget.region_demand import RegionDemand
from budget.store import InProcessStore
from engines.kv_events import EventBatch
from extproc.request.crossing_token import CrossingDesk
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.verdicts import Routed
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, own_draws
from sim.fleet.clock import VirtualClock
from sim.fleet.engine_pool import EnginePool, SimEngine, engine_addresses, probe, scrape
from sim.fleet.fleet_requests import FleetRequests
from sim.fleet.fleet_types import EngineOutage, Sample, Served
from sim.fleet.prompts import library
from sim.fleet.sidecar import SimulatedSidecar, chat, run_now
from sim.server.model import LatencyConfig
from sim.server.tokenizer import shared_bpe


class OfflineFleet(FleetRequests):
    def __init__(
        self,
        policy: Policy,
        seed: int = 0,
        budgets: bool = True,
        breaker: bool = True,
        controller: bool = False,
        fixed_multipliers: dict[str, float] | None = None,
        kv_capacity_tokens: int = 400_000,
        max_running: int = 64,
        latency: LatencyConfig | None = None,
        overcommit_ratio: float = 1.0,
        overcommit_error_rate: float = 0.5,
        sidecar_split: Sequence[float] = (1.0,),
        waiting_room: bool = True,
        client_retries: int = 0,
        shared_ledger: bool = True,
        max_queue: int = 10_000,
        engines: Mapping[str, int] | None = None,
        outages: Sequence[EngineOutage] = (),
        prefix_entries: int = 50_000,
        counter: PromptCounter | None = None,
        block_size: int | None = None,
        kv_events_delay_s: float | None = None,
        prefill_queue: bool = False,
        ahead: AheadPlanner | None = None,
        key_budgets: bool = False,
        clock: VirtualClock | None = None,
        shares: RegionShares | None = None,
        demand: RegionDemand | None = None,
        crossing: Crossing | None = None,
        desk: CrossingDesk | None = None,
    ) -> None:
        """`waiting_room`: the sidecars hold requests refused only for capacity until room
        frees (False: they refuse them at once). `client_retries`: how many times a client
        retries a 429 / 503 after its Retry-After, as the OpenAI SDKs do (their default is
        2; here 0, a refusal is lost). `shared_ledger`: the sidecars share one KV ledger,
        as replicas share Redis's (False: each its own, against capacity / replicas, as
        with the in-process store). `max_queue`: requests an engine keeps waiting before it
        answers 503 (the simulated pool's --max-queue is 256; the comparisons here keep a
        queue that never fills, as they were published). `engines`: how many engines each
        pool has (absent: one; the pool's KV capacity and batch slots are shared out among
        them), picked by the sidecars as the policy says (`picker`); `outages`: engines
        down for a while; `prefix_entries`: each engine's prefix cache (prompt segments);
        `counter`: the sidecars' prompt counter (None: the real one over the prompt
        library's texts; a replay gives one that answers with the recorded counts);
        `block_size`: the engines' KV caches in blocks of that many tokens with vLLM's
        prefix caching in them (sim.server.paged_kv; None: weighted tokens beside an LRU of
        `prefix_entries` message prefixes); `kv_events_delay_s`: such engines publish their
        KV events, and each batch reaches every sidecar's picker that long after (None:
        they publish nothing); `prefill_queue`: each engine prefills one prompt after
        another (a prompt's uncached tokens at the latency model's prefill cost), so that
        prefills wait for each other as on a GPU whose compute they saturate (False: each
        request's TTFT is its own, whatever else the engine prefills); `ahead`: the quotas
        moved ahead of forecast or declared ramps (budget.ahead, stepped with the controller;
        its outlook's clock is this fleet's virtual one); `key_budgets`: the per-key dynamic
        budgets (budget.key_quotas) fed and stepped as in the sidecar, enforced where the
        policy says (`breaker.controller_key_budgets`), a raised tenant's lifted. `clock`: a
        virtual clock shared with other fleets (sim.fleet.regions: regions on one clock;
        None: its own); `shares`, `demand`: its region's share of each global tenant and
        where its sidecars count those tenants' demand and usage (sim.fleet.regions; None:
        one region); `crossing`, `desk`: where its sidecars send saturated pools' tolerant
        requests and their crossing tokens (a request re-routed to a peer goes to
        `cross_out`, set by sim.fleet.regions; None: nothing crosses)."""
        self.policy = policy
        self.client_retries = client_retries
        self.seed = seed
        self.use_breaker = breaker
        self.clock = clock or VirtualClock()
        self.latency = latency or LatencyConfig()
        # overcommit_ratio > 1: the engine admits past its real KV capacity, and requests
        # started in that region fail like an OOM (a 500), as in the simulated pool.
        self.overcommit_error_rate = overcommit_error_rate
        counts = engines or {}
        self.engines = {
            name: EnginePool(
                engine_addresses(index, counts.get(name, 1)),
                kv_capacity_tokens,
                max_running,
                max_queue,
                overcommit_ratio,
                prefix_entries,
                block_size,
            )
            for index, name in enumerate(policy.pools)
        }
        self._pool_of = {e.address: n for n, p in self.engines.items() for e in p.engines}
        self.kv_events_delay_s = kv_events_delay_s
        self.prefill_queue = prefill_queue
        self._batches: dict[int, tuple[str, EventBatch]] = {}
        self.outages = list(outages)
        self._on_engine: dict[str, SimEngine] = {}
        self.retried = 0  # connections refused and retried on another engine
        self.windows = ResponseWindows(self.clock, slot_s=5.0, horizon_s=600.0)
        self.board = BreakerBoard(
            lambda: policy,
            self.windows,
            # The breaker and the controller see the engines as the sidecar does: through a
            # metrics scrape every scrape_interval_s, not the instantaneous state.
            kv_cache_usage=lambda pool: self._scraped.get(pool, (None, None))[0],
            gpu_memory_usage=lambda: None,
            clock=self.clock,
            engine_queue=lambda pool: self._scraped.get(pool, (None, None))[1],
            engines_out=lambda pool: self.sidecars[0].fleet.out(pool),
            engines_up=lambda pool: self.sidecars[0].fleet.up_fraction(pool),
        )
        self._scraped: dict[str, tuple[float, float]] = {}
        # The dynamic quota controller: the same TierMultipliers the sidecar runs.
        self.use_controller = controller
        self.quotas = TierMultipliers()
        if fixed_multipliers is not None:  # a static quota: set once, never stepped
            self.quotas.values.update(fixed_multipliers)
        # What admission applies: the reactive multipliers, through the planner when there
        # is one (as in the sidecar's QuotaLoop); each tenant's demand asked per interval.
        self.ahead = ahead
        self.applied: dict[str, float] = dict(self.quotas.values)
        self.ahead_moves: list[Adjustment] = []
        self._asked: dict[str, float] = {}
        interval_s = policy.breaker.controller_interval_s
        self.key_quotas = KeyQuotas(interval_s) if key_budgets else None
        ceilings = (
            None if self.key_quotas is None else AheadCeilings(self.key_quotas, lambda: self.ahead)
        )
        # The sidecar replicas: each request goes through one, drawn with the split's
        # weights (uneven load balancing across Envoys). Budgets are one shared store (Redis
        # shares them exactly), and so is the KV ledger unless told otherwise: Redis answers
        # in no virtual time here, and each replica still learns of room another's ends
        # freed only at its waiting room's tick, as in production. The ratio is learned
        # once per controller interval, as the shared ledger's guard lets it (kv_ratio.lua).
        # The prompt counter is the sidecar's.
        self.sidecar_split = [w / sum(sidecar_split) for w in sidecar_split]
        store = InProcessStore(self.clock) if budgets else None
        book = (
            LocalBook(
                self.clock,
                ratio_gap_s=policy.breaker.controller_interval_s * 0.8,
                shared=len(sidecar_split) > 1,
            )
            if shared_ledger
            else None
        )
        if counter is None:
            counter = PromptCounter(shared_bpe(), policy.counting)  # inline: nothing waits
        self.sidecars = [
            SimulatedSidecar(
                policy,
                self.board if breaker else None,
                store,
                counter,
                self.clock,
                self.applied,
                random.Random(seed * 100 + index),
                schedule=self._schedule if waiting_room else None,
                book=book,
                engines={n: [e.address for e in p.engines] for n, p in self.engines.items()},
                key_quotas=self.key_quotas,
                ceilings=ceilings,
                shares=shares,
                demand=demand,
                crossing=crossing,
                desk=desk,
            )
            for index in range(len(self.sidecar_split))
        ]
        self._calls: dict[int, Callable[[], None]] = {}
        # Crossing regions (sim.fleet.regions): where a request re-routed to a peer goes
        # (request id, peer, the headers it carries), and what a request that came from
        # a peer tells its origin when it ends here (its result, the status it ended with).
        self.cross_out: Callable[[str, str, Mapping[str, str]], None] | None = None
        self._from_peer: dict[str, Callable[[Served, int], None]] = {}
        self._headers: dict[str, Mapping[str, str]] = {}
        self._tick_pending = False
        self._attempts: dict[str, int] = {}
        self._attempt_at: dict[str, float] = {}
        self._sidecar_of: dict[str, int] = {}
        self._routed: dict[str, Routed] = {}
        self.timeline: list[Sample] = []
        self.oom_events = 0
        self._last_score: float | None = None
        self._accounted_s = 0.0
        self.until_s = math.inf
        self.multiplier_history: list[tuple[float, dict[str, float]]] = []
        # (time, replica, "kv_lend:<pool>", the share now lent to sheddable): budget.lending
        self.lending_history: list[tuple[float, int, str, float]] = []
        self.results: dict[str, Served] = {}
        self._outputs: dict[str, int] = {}  # request id -> output tokens it will generate
        self._arrivals: dict[str, Arrival] = {}
        self._events: list[tuple[float, int, str, str]] = []
        self._sequence = itertools.count()

    def _schedule(self, callback: Callable[[], None]) -> None:
        """Run `callback` at the current virtual time, after the event now running (how an
        admission resumes when the waiting room dispatches or times it out)."""
        number = next(self._sequence)
        self._calls[number] = callback
        heapq.heappush(self._events, (self.clock.now_s, number, "call", str(number)))

    def run(self, arrivals: Iterable[Arrival], until_s: float) -> dict[str, Served]:
        self.begin(arrivals, until_s)
        while self.step():
            pass
        return self.results

    def begin(self, arrivals: Iterable[Arrival], until_s: float) -> None:
        """Put the run's arrivals and periodic events on the queue; `step` then plays them
        one by one (`run` does both; sim.fleet.regions interleaves several fleets' steps on
        one clock)."""
        for index, arrival in enumerate(arrivals):
            request_id = f"r{index}"
            self._arrivals[request_id] = arrival
            self._push(arrival.at_s, "arrive", request_id)
        interval_s = self.policy.breaker.evaluate_interval_s
        for tick in range(math.ceil(until_s / interval_s)):
            self._push(tick * interval_s, "evaluate", "")
        control_s = self.policy.breaker.controller_interval_s
        for tick in range(1, math.ceil(until_s / control_s)):
            self._push(tick * control_s, "control", "")
        scrape_s = self.policy.breaker.scrape_interval_s
        for tick in range(math.ceil(until_s / scrape_s)):
            self._push(tick * scrape_s, "scrape", "")
        if self.outages:
            probe_s = self.policy.engines.health.probe_interval_s
            for tick in range(math.ceil(until_s / probe_s)):
                self._push(tick * probe_s, "probe", "")
            for number, outage in enumerate(self.outages):
                self._push(outage.at_s, "down", str(number))
                if outage.until_s < until_s:
                    self._push(outage.until_s, "up", str(number))
        self.until_s = until_s

    def arrive_from_peer(
        self,
        request_id: str,
        arrival: Arrival,
        headers: Mapping[str, str],
        on_end: Callable[[Served, int], None],
    ) -> None:
        """A request a peer region re-routed here arrives now, with its crossing token;
        `on_end` gets its result and status when it ends (refused, failed or served)."""
        self._arrivals[request_id] = arrival
        self._headers[request_id] = headers
        self._from_peer[request_id] = on_end
        self._push(self.clock.now_s, "arrive", request_id)

    def next_event_s(self) -> float | None:
        """When the next queued event happens; None: nothing left."""
        return self._events[0][0] if self._events else None

    def step(self) -> bool:
        """Play the next event; False when none was left."""
        if not self._events:
            return False
        at_s, _, kind, request_id = heapq.heappop(self._events)
        self._account(at_s)
        self.clock.now_s = at_s
        if kind == "arrive":
            self._arrive(request_id)
        elif kind == "call":
            self._calls.pop(int(request_id))()
        elif kind == "room":
            self._tick_pending = False
            for sidecar in self.sidecars:
                run_now(sidecar.admission.kv.dispatcher.tick())
            self._tick_room()
        elif kind == "finish":
            self._finish(request_id)
        elif kind == "kv":
            self._deliver(int(request_id))
        elif kind == "evaluate":
            if self.use_breaker:
                self.board.evaluate()
            self._sample()
        elif kind == "control" and self.use_controller:
            self._control()
        elif kind == "scrape":
            self._scrape()
        elif kind == "probe":
            probe(self.engines, [s.fleet for s in self.sidecars])
        elif kind in ("down", "up"):
            self._outage(self.outages[int(request_id)], kind == "up")
        return True

    def _scrape(self) -> None:
        """Every sidecar scrapes every engine (the pools' signals, each engine's state)."""
        self._scraped = {
            name: (pool.usage_perc(), pool.queue_ratio()) for name, pool in self.engines.items()
        }
        scrape(self.engines, [s.fleet for s in self.sidecars])

    def _outage(self, outage: EngineOutage, back: bool) -> None:
        """An engine goes down (what ran or waited on it is lost: Envoy answers 503) or comes
        back empty."""
        pool = self.engines[outage.pool]
        engine = pool.engines[outage.index]
        if back:
            self._published(pool.restart(outage.index))
            return
        engine.up, engine.down_since_s = False, self.clock.now_s
        lost = [r for r, e in self._on_engine.items() if e is engine]
        for request_id in lost:
            self._on_engine.pop(request_id)
            self.results[request_id].outcome = "engine_lost"
            self._outputs.pop(request_id, None)
            self._end(request_id, status=503, output=None, engine=engine)

    def _arrive(self, request_id: str) -> None:
        arrival = self._arrivals[request_id]
        sidecar = self.sidecars[self._sidecar_index(request_id, arrival)]
        texts = arrival.texts or library(arrival.crafted).messages(arrival.counted)
        self._attempts[request_id] = self._attempts.get(request_id, 0) + 1
        if self._attempts[request_id] == 1:  # demand: what the tenant asks, refused or not
            tenant = arrival.key.tenant
            asked = arrival.prompt_tokens + arrival.max_tokens
            self._asked[tenant] = self._asked.get(tenant, 0.0) + asked
        self._attempt_at[request_id] = self.clock.now_s
        request = chat(
            texts,
            arrival.max_tokens,
            arrival.stream,
            arrival.conversation_texts,
            arrival.chat_roles(len(texts)),
        )
        sidecar.submit(
            arrival.key,
            request,
            request_id,
            lambda decided: self._decided(request_id, decided),
            self._headers.get(request_id),
        )
        self._tick_room()

    def _tick_room(self) -> None:
        """The sidecar's room timer (every 50 ms while anything waits): timeouts, and
        dispatch for what no event announces."""
        if self._tick_pending or not any(
            len(s.admission.kv.dispatcher.room) for s in self.sidecars
        ):
            return
        self._tick_pending = True
        self._push(self.clock.now_s + ROOM_TICK_S, "room", "")

    def _account(self, until_s: float) -> None:
        """Advance the utilisation integrals to `until_s` (state is constant in between)."""
        elapsed_s = min(until_s, self.until_s) - self._accounted_s
        if elapsed_s <= 0:
            return
        for pool in self.engines.values():
            for engine in pool.engines:
                engine.busy_s += engine.occupancy * elapsed_s
        self._accounted_s += elapsed_s

    def utilisation(self) -> dict[str, float]:
        """Per pool: occupancy averaged over the run, 0..1 -- at each moment the fuller of
        the KV cache and the batch slots, whichever bounds how much the engine can batch
        (long contexts fill the cache first, short ones the slots)."""
        span_s = max(self._accounted_s, 1e-9)
        return {name: engine.busy_s / span_s for name, engine in self.engines.items()}

    def busiest_pool(self) -> str:
        return max(self.engines, key=lambda name: self.engines[name].served)

    def _sample(self) -> None:
        self.timeline.append(
            Sample(
                at_s=self.clock.now_s,
                kv_usage={n: p.usage_perc() for n, p in self.engines.items()},
                waiting={n: p.num_waiting for n, p in self.engines.items()},
                levels={n: int(self.board.level(n)) for n in self.engines},
                multipliers=dict(self.applied),
                score=self._last_score,
            )
        )

    def _scraped_kv(self, pool: str) -> float | None:
        return self._scraped.get(pool, (None, None))[0]

    def _control(self) -> None:
        """One controller interval, from the same inputs the sidecar uses (board.fleet_load)."""
        score, memory_usage = self.board.fleet_load()
        for sidecar in self.sidecars:  # every sidecar scrapes the same engines
            run_now(
                sidecar.admission.kv.observe(
                    self.policy, lambda pool: self._scraped.get(pool, (None, None))[0]
                )
            )
        self._last_score = score
        moved = bool(self.quotas.step(score))
        if self.ahead is not None:
            tiers = tenant_tiers(self.policy.keys.values())
            steps = self.ahead.step(self.clock.now_s, tiers, self._asked, score)
            self.ahead_moves += steps
            moved = moved or bool(steps)
            caps: dict[str, float] = {}
            self.ahead.apply(self.quotas.values, self.applied, caps)
            for sidecar in self.sidecars:
                sidecar.admission.kv.shares.caps.clear()
                sidecar.admission.kv.shares.caps.update(caps)
        else:
            self.applied.update(self.quotas.values)
        self._asked = {}
        if self.key_quotas is not None:
            self.key_quotas.step(self.policy.keys.values(), memory_usage)
        if moved:
            self.multiplier_history.append((self.clock.now_s, dict(self.applied)))
        for index, sidecar in enumerate(self.sidecars):  # each replica lends from its own room
            kv = sidecar.admission.kv
            for loan in kv.shares.step(self.policy, score, self._scraped_kv):
                self.lending_history.append((self.clock.now_s, index, loan.what, loan.after))

    def _sidecar_index(self, request_id: str, arrival: Arrival) -> int:
        index = self._sidecar_of.get(request_id)
        if index is None:
            index = 0
            if len(self.sidecars) > 1:
                draw = own_draws(self.seed, arrival, 2).random()
                index = int(np.searchsorted(np.cumsum(self.sidecar_split), draw))
                index = min(index, len(self.sidecars) - 1)
            self._sidecar_of[request_id] = index
        return index
