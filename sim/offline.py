"""A discrete-event fleet on a virtual clock that runs slogate's REAL decision code.

What lives here: `OfflineFleet`, which plays a workload (arrivals of (time, key, prompt,
max_tokens)) through the same steps as the sidecar -- routing from the policy, the breaker
board and shedding table, the budget ledger -- into simulated engines (sim.model's KV cache
and latency model, one per pool). Nothing is copied: the breaker and the budgets are the
modules the sidecar imports, fed by a virtual clock. One simulated hour runs in seconds.

Each request draws its latencies from its own random generator seeded by (seed, its arrival
time and prompt), so two runs that differ only in another tenant's traffic give a tenant's requests
the same draws: differences come from interference, not from reshuffled randomness.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from breaker.board import BreakerBoard
from breaker.controller import TierMultipliers
from breaker.kv_admission import KvLedger, kv_footprint, pool_capacity
from breaker.latency import SLO_RATIO, ResponseWindows
from breaker.objectives import latency_objective_s
from breaker.shedding import Action, budget_multiplier, shed
from budget.ledger import Charge, KeyState, reserve, scale_limits, settle
from policy import ApiKey, Policy
from sim.model import Admission, KvCache, LatencyConfig, LatencyModel, kv_tokens_for


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    key: ApiKey
    prompt_tokens: int  # what the engine holds and reports
    max_tokens: int
    # What the sidecar's counter makes of the prompt (None: the real count, which it gives
    # for every text it counts). A workload can set it to model a count that is off.
    counted_prompt_tokens: int | None = None

    @property
    def counted(self) -> int:
        return (
            self.prompt_tokens if self.counted_prompt_tokens is None else self.counted_prompt_tokens
        )


@dataclass(slots=True)
class Served:
    """What became of one request."""

    arrival: Arrival
    pool: str
    outcome: str  # served, budget, shed, kv_full, engine_full, oom
    ttft_s: float | None = None  # arrival to first token, queueing included
    done_s: float | None = None
    output_tokens: int = 0


class VirtualClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass(slots=True)
class _Engine:
    kv: KvCache
    waiting: dict[str, tuple[int, Arrival]] = field(default_factory=dict)
    # Integral over virtual time, for utilisation: occupancy (the fuller of the KV cache and
    # the batch slots, 0..1) x seconds.
    busy_s: float = 0.0
    served: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet once per breaker evaluation, for plots: per pool KV usage, queue, level."""

    at_s: float
    kv_usage: dict[str, float]
    waiting: dict[str, int]
    levels: dict[str, int]
    multipliers: dict[str, float]
    score: float | None


class OfflineFleet:
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
    ) -> None:
        self.policy = policy
        self.seed = seed
        self.use_budgets = budgets
        self.use_breaker = breaker
        self.clock = VirtualClock()
        self.latency = latency or LatencyConfig()
        # overcommit_ratio > 1: the engine admits past its real KV capacity, and requests
        # started in that region fail like an OOM (a 500), as in the simulated pool.
        self.overcommit_error_rate = overcommit_error_rate
        self.engines = {
            name: _Engine(
                KvCache(
                    kv_capacity_tokens,
                    max_running=max_running,
                    max_queue=10_000,
                    overcommit_ratio=overcommit_ratio,
                )
            )
            for name in policy.pools
        }
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
        )
        self._scraped: dict[str, tuple[float, float]] = {}
        self.ledgers: dict[str, KeyState] = {}
        # The dynamic quota controller: the same TierMultipliers the sidecar runs.
        self.use_controller = controller
        self.quotas = TierMultipliers()
        if fixed_multipliers is not None:  # a static quota: set once, never stepped
            self.quotas.values.update(fixed_multipliers)
        self.apply_multipliers = controller or fixed_multipliers is not None
        # Admission for pools whose policy gives their KV cache or batch slots: the ledger.
        # One ledger per sidecar replica; each request goes through one, drawn with the
        # split's weights (uneven load balancing across Envoys), and each admits against
        # capacity / replicas, as in production.
        self.sidecar_split = [w / sum(sidecar_split) for w in sidecar_split]
        self.kv_ledgers = [KvLedger() for _ in self.sidecar_split]
        self._sidecar_of: dict[str, int] = {}
        self.timeline: list[Sample] = []
        self.oom_events = 0
        self._last_score: float | None = None
        self._accounted_s = 0.0
        self.until_s = math.inf
        self.multiplier_history: list[tuple[float, dict[str, float]]] = []
        self.results: dict[str, Served] = {}
        self._outputs: dict[str, int] = {}  # request id -> output tokens it will generate
        self._arrivals: dict[str, Arrival] = {}
        self._events: list[tuple[float, int, str, str]] = []
        self._sequence = itertools.count()

    def _push(self, at_s: float, kind: str, request_id: str) -> None:
        heapq.heappush(self._events, (at_s, next(self._sequence), kind, request_id))

    def run(self, arrivals: Iterable[Arrival], until_s: float) -> dict[str, Served]:
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
        self.until_s = until_s
        while self._events:
            at_s, _, kind, request_id = heapq.heappop(self._events)
            self._account(at_s)
            self.clock.now_s = at_s
            if kind == "arrive":
                self._arrive(request_id)
            elif kind == "finish":
                self._finish(request_id)
            elif kind == "evaluate":
                if self.use_breaker:
                    self.board.evaluate()
                self._sample()
            elif kind == "control" and self.use_controller:
                self._control()
            elif kind == "scrape":
                self._scraped = {
                    name: (engine.kv.usage_perc, self._queue_ratio(name))
                    for name, engine in self.engines.items()
                }
        return self.results

    def _arrive(self, request_id: str) -> None:
        arrival = self._arrivals[request_id]
        policy = self.policy
        context = arrival.counted + arrival.max_tokens  # admission decides on the count
        pool = policy.pool_for(context)
        bucket = policy.bucket_for(context)
        tier = arrival.key.tier
        level = self.board.level(pool) if self.use_breaker else None
        if level is not None:
            verdict = shed(level, tier, context)
            if verdict.action is Action.REFUSE:
                self.results[request_id] = Served(arrival, pool, "shed")
                return
            if verdict.action is Action.REROUTE:
                pool = policy.fallback_pool
        # The sidecar's order: breaker, KV admission, budgets (a refused budget frees the KV).
        capacity = pool_capacity(policy.pools[pool], len(self.kv_ledgers))
        if capacity is not None:
            footprint = kv_footprint(context, bucket)
            share = policy.breaker.kv_shares[tier]
            ledger = self._ledger_for(request_id, arrival)
            if not ledger.admit(request_id, pool, footprint, capacity, share).admitted:
                self.results[request_id] = Served(arrival, pool, "kv_full")
                return
        if self.use_budgets:
            limits = arrival.key.limits
            factor = budget_multiplier(level, tier) if level is not None else 1.0
            if self.apply_multipliers:
                factor *= self.quotas.values[tier.value]
            limits = scale_limits(limits, factor)
            state = self.ledgers.setdefault(arrival.key.key_id, KeyState())
            charge = Charge(context * bucket.cost_weight, context)
            if not reserve(state, limits, charge, request_id, self.clock.now_s, 3600.0).admitted:
                self._ledger_for(request_id, arrival).release(request_id)
                self.results[request_id] = Served(arrival, pool, "budget")
                return
        engine = self.engines[pool]
        # What the engine will hold: the prompt and the tokens it will really generate (vLLM
        # grows a request's cache as it decodes; it never sets max_tokens aside). The
        # sidecar's ledger counts prompt + max_tokens: an upper bound, as in production.
        output = self._outputs[request_id] = self._output_tokens(arrival)
        kv_tokens = kv_tokens_for(arrival.prompt_tokens, output, self.latency.buckets)
        engine.served += 1
        self.results[request_id] = Served(arrival, pool, "served")
        admission = engine.kv.submit(request_id, kv_tokens)
        if admission is Admission.ADMITTED:
            self._start(request_id, engine)
        elif admission is Admission.QUEUED:
            engine.waiting[request_id] = (kv_tokens, arrival)
        else:
            self.results[request_id].outcome = "engine_full"
            self._outputs.pop(request_id, None)
            self._ledger_for(request_id, arrival).release(request_id)
            self._settle(request_id, None)

    def _account(self, until_s: float) -> None:
        """Advance the utilisation integrals to `until_s` (state is constant in between)."""
        elapsed_s = min(until_s, self.until_s) - self._accounted_s
        if elapsed_s <= 0:
            return
        for engine in self.engines.values():
            kv = engine.kv
            occupancy = max(kv.usage_perc, kv.num_running / kv.max_running)
            engine.busy_s += occupancy * elapsed_s
        self._accounted_s += elapsed_s

    def utilisation(self) -> dict[str, float]:
        """Per pool: occupancy averaged over the run, 0..1 -- at each moment the fuller of
        the KV cache and the batch slots, whichever bounds how much the engine can batch
        (long contexts fill the cache first, short ones the slots)."""
        span_s = max(self._accounted_s, 1e-9)
        return {name: engine.busy_s / span_s for name, engine in self.engines.items()}

    def busiest_pool(self) -> str:
        return max(self.engines, key=lambda name: self.engines[name].served)

    def _queue_ratio(self, pool: str) -> float:
        kv = self.engines[pool].kv
        return kv.num_waiting / max(1, kv.num_running)

    def _sample(self) -> None:
        self.timeline.append(
            Sample(
                at_s=self.clock.now_s,
                kv_usage={n: e.kv.usage_perc for n, e in self.engines.items()},
                waiting={n: e.kv.num_waiting for n, e in self.engines.items()},
                levels={n: int(self.board.level(n)) for n in self.engines},
                multipliers=dict(self.quotas.values),
                score=self._last_score,
            )
        )

    def _control(self) -> None:
        """One controller interval, from the same inputs the sidecar uses (board.fleet_load)."""
        score, _ = self.board.fleet_load()
        for ledger in self.kv_ledgers:  # every sidecar scrapes the same engines
            ledger.observe_pools(
                self.policy.pools,
                len(self.kv_ledgers),
                lambda pool: self._scraped.get(pool, (None, None))[0],
            )
        self._last_score = score
        if self.quotas.step(score):
            self.multiplier_history.append((self.clock.now_s, dict(self.quotas.values)))

    def _ledger_for(self, request_id: str, arrival: Arrival) -> KvLedger:
        index = self._sidecar_of.get(request_id)
        if index is None:
            if len(self.kv_ledgers) == 1:
                index = 0
            else:
                draw = np.random.default_rng(
                    [self.seed, round(arrival.at_s * 1e6), arrival.prompt_tokens, 2]
                ).random()
                index = int(np.searchsorted(np.cumsum(self.sidecar_split), draw))
                index = min(index, len(self.kv_ledgers) - 1)
            self._sidecar_of[request_id] = index
        return self.kv_ledgers[index]

    def _output_tokens(self, arrival: Arrival) -> int:
        """How long the model 'wants' to answer, from the request's own generator."""
        draws = np.random.default_rng(
            [self.seed, round(arrival.at_s * 1e6), arrival.prompt_tokens, 1]
        )
        return LatencyModel(self.latency, draws).sample_output_tokens(arrival.max_tokens)

    def _start(self, request_id: str, engine: _Engine) -> None:
        arrival = self._arrivals[request_id]
        engine.waiting.pop(request_id, None)
        # Seeded by the arrival itself, so the same request draws the same latencies in runs
        # that differ only in other tenants' traffic.
        draws = np.random.default_rng([self.seed, round(arrival.at_s * 1e6), arrival.prompt_tokens])
        model = LatencyModel(self.latency, draws)
        running = engine.kv.num_running
        ttft_s = model.sample_ttft_s(arrival.prompt_tokens, running)
        served = self.results[request_id]
        if engine.kv.is_overcommitted and draws.random() < self.overcommit_error_rate:
            # Started past the real KV capacity: the engine fails it during prefill.
            served.outcome = "oom"
            served.done_s = self.clock.now_s + ttft_s
            self._push(served.done_s, "finish", request_id)
            return
        output = self._outputs[request_id]
        context = arrival.prompt_tokens + arrival.max_tokens
        decode_s = output * model.sample_decode_s_per_token(running, context)
        served.ttft_s = self.clock.now_s - arrival.at_s + ttft_s
        served.done_s = self.clock.now_s + ttft_s + decode_s
        self._push(served.done_s, "finish", request_id)
        served.output_tokens = output

    def _finish(self, request_id: str) -> None:
        served = self.results[request_id]
        engine = self.engines[served.pool]
        self._ledger_for(request_id, served.arrival).release(request_id)
        for started in engine.kv.release(request_id):
            self._start(started, engine)
        arrival = served.arrival
        context = self.policy.bucket_for(arrival.prompt_tokens + arrival.max_tokens)
        tier = arrival.key.tier.value
        output = self._outputs.pop(request_id)
        if served.outcome == "oom":
            self.oom_events += 1
            self.windows.record_response(served.pool, 500)
            self._settle(request_id, None)  # failed upstream: the charge is refunded
            return
        assert served.ttft_s is not None
        self.windows.record_latency("ttft", served.pool, tier, context.name, served.ttft_s)
        # Every simulated request streams: the breaker reads its TTFT against its SLO.
        objective_s = latency_objective_s(self.policy, arrival.key.tier, context.name, True, None)
        if objective_s:
            ratio = served.ttft_s / objective_s
            self.windows.record_latency(SLO_RATIO, served.pool, tier, context.name, ratio)
        self.windows.record_response(served.pool, 200)
        used = arrival.prompt_tokens + output
        self._settle(request_id, Charge(used * context.cost_weight, used))

    def _settle(self, request_id: str, actual: Charge | None) -> None:
        if not self.use_budgets:
            return
        arrival = self._arrivals[request_id]
        state = self.ledgers[arrival.key.key_id]
        settle(state, arrival.key.limits, request_id, actual, self.clock.now_s)


def poisson_arrivals(
    key: ApiKey,
    rate_per_s: float,
    start_s: float,
    end_s: float,
    prompt_tokens: tuple[int, int],
    max_tokens: int,
    seed: int,
    shape: Sequence[tuple[float, float]] = (),
) -> list[Arrival]:
    """Poisson arrivals with uniformly drawn prompt lengths, reproducible for a seed.

    `shape`: (time, factor) points; the rate at time t is rate_per_s x the factor linearly
    interpolated between them (a daily curve, a ramp). Drawn by thinning: candidates at the
    peak rate, each kept with probability factor / peak.
    """
    rng = np.random.default_rng(seed)
    times = [float(t) for t, _ in shape]
    factors = [float(f) for _, f in shape]
    peak = max(factors, default=1.0)
    if peak <= 0:
        return []
    arrivals: list[Arrival] = []
    now_s = start_s
    while True:
        now_s += float(rng.exponential(1.0 / (rate_per_s * peak)))
        if now_s >= end_s:
            return arrivals
        prompt = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
        if shape and rng.random() * peak > float(np.interp(now_s, times, factors)):
            continue
        arrivals.append(Arrival(now_s, key, prompt, max_tokens))


def p99(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
