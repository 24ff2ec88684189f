"""All breakers of one sidecar: one per pool and a global one on top. Pure, clock injected.

What lives here: `pool_signals` (latency windows + engine + GPU readings -> `Signals`, with
the SLO table from the policy), `load_score` (a pool's signals as one number: the quota
controller's input, budget.quotas) and `BreakerBoard`, which evaluates every breaker on the
caller's schedule and answers the request path's one question: what level applies to this
pool now. Metrics and timers live with the caller (admission.breaker_step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from breaker.latency import SLO_RATIO, ResponseWindows
from breaker.levels import BreakerLevel, BreakerState, Signals, Transition, step
from policy.domain import Tier
from policy.schema import GLOBAL_BREAKER, Policy

GLOBAL = GLOBAL_BREAKER


def p99_over_slo(windows: ResponseWindows, policy: Policy, pool: str) -> float | None:
    """Worst P99 of latency / objective over the (tier, bucket) pairs with enough samples:
    streamed requests by their TTFT against the TTFT SLO, the others by their whole time
    against the objective for their output (breaker.objectives)."""
    config = policy.breaker
    worst: float | None = None
    for tier in Tier:
        for bucket in policy.buckets:
            merged = windows.merged(SLO_RATIO, config.window_s, pool, tier.value, bucket.name)
            if merged.total < config.min_samples:
                continue
            ratio = merged.quantile(0.99)
            if ratio is not None:
                worst = ratio if worst is None else max(worst, ratio)
    return worst


def load_score(
    p99_over_slo: float | None,
    kv_cache_usage: float | None,
    latency_weight: float = 0.7,
    kv_weight: float = 0.3,
    queue_ratio: float | None = None,
    kv_line: float | None = None,
) -> float | None:
    """Weighted load; 1.0 = at the SLO / at a full cache. None without any signal.

    Two saturation guards sit on top of the weighted sum, because an average hides one
    resource at its limit behind the others' slack:
    - a queue in the engine (`queue_ratio` = waiting / running requests > 0) means the
      engine is at capacity: the score is at least 1 + queue_ratio. The P99 of finished
      requests shows a queue only when the queued requests end;
    - KV-cache usage at `kv_line` (the breaker's L1 line) scores 1.0: the controller trims
      quotas before the breaker has to shed whole classes of traffic.
    """
    parts = [(latency_weight, p99_over_slo), (kv_weight, kv_cache_usage)]
    known = [(w, v) for w, v in parts if v is not None]
    if not known and queue_ratio is None:
        return None
    score = sum(w * v for w, v in known) / sum(w for w, _ in known) if known else 0.0
    if queue_ratio is not None and queue_ratio > 0:
        score = max(score, 1.0 + queue_ratio)
    if kv_line and kv_cache_usage is not None:
        score = max(score, kv_cache_usage / kv_line)
    return score


# The tiers whose TTFT objective the engines' whole-pool TTFT is held against: the engine
# knows no tiers, so its P99 is read against the loosest of these for the pool's buckets
# (sheddable is left out: it is the tier meant to take the slowness).
_ENGINE_TIERS = (Tier.CRITICAL, Tier.STANDARD)


def engine_objective_s(policy: Policy, pool: str) -> float | None:
    """The TTFT objective (s) of the pool's engines as a whole: the loosest critical or
    standard TTFT SLO over the context buckets routed to `pool`; None without one."""
    objectives = [
        ms
        for bucket in policy.buckets
        if pool
        in {
            policy.pool_for(bucket.min_tokens),
            policy.pool_for(bucket.max_tokens if bucket.max_tokens is not None else 1 << 40),
        }
        for tier in _ENGINE_TIERS
        if (ms := policy.slo_ms(tier, bucket.name)) is not None
    ]
    return max(objectives) / 1000 if objectives else None


def engine_p99_over_slo(
    engine_ttft: Callable[[str, float, float, int], float | None], policy: Policy, pool: str
) -> float | None:
    """The pool's engines' TTFT P99 over the breaker window against their objective."""
    objective_s = engine_objective_s(policy, pool)
    if objective_s is None:
        return None
    config = policy.breaker
    p99_s = engine_ttft(pool, 0.99, config.window_s, config.min_samples)
    return None if p99_s is None else p99_s / objective_s


def error_rate(
    windows: ResponseWindows,
    policy: Policy,
    pool: str | None,
    leave_out: frozenset[str] = frozenset(),
) -> float | None:
    """The share of 5xx in the window, without the answers of the engines `leave_out`
    names (taken out of the pool: one dead engine is not the pool failing)."""
    responses, errors = windows.response_counts(pool, policy.breaker.window_s, leave_out)
    if responses < policy.breaker.min_samples:
        return None
    return errors / responses


def fleet_error_rate(
    windows: ResponseWindows,
    policy: Policy,
    engines_out: Callable[[str], frozenset[str]] = lambda pool: frozenset(),
) -> float | None:
    """The global breaker's error signal: a failure of the whole fleet, i.e. every pool with
    traffic failing at once (the lowest of their error rates). One pool's errors are its own
    breaker's business; summed across pools they would let one sick pool that carries most
    of the traffic shed non-critical requests on the healthy pools too."""
    rates = [
        r
        for pool in policy.pools
        if (r := error_rate(windows, policy, pool, engines_out(pool))) is not None
    ]
    return min(rates) if rates else None


@dataclass(frozen=True, slots=True)
class Reading:
    """What the board read for one breaker, kept for metrics and the admin view."""

    signals: Signals
    transition: Transition | None


class BreakerBoard:
    def __init__(
        self,
        policy: Callable[[], Policy],
        windows: ResponseWindows,
        kv_cache_usage: Callable[[str], float | None],
        gpu_memory_usage: Callable[[], float | None],
        clock: Callable[[], float],
        engine_queue: Callable[[str], float | None] = lambda pool: None,
        engine_ttft: Callable[[str, float, float, int], float | None] = lambda *_: None,
        engines_out: Callable[[str], frozenset[str]] = lambda pool: frozenset(),
        engines_up: Callable[[str], float | None] = lambda pool: None,
    ) -> None:
        """`engine_ttft(pool, q, window_s, min_samples)`: the q-quantile of the pool's
        engines' TTFT over the window (EngineReadings.ttft_quantile_s); None: no reading.
        `engines_out(pool)`: the engines taken out of the pool, whose answers its error rate
        leaves out; `engines_up(pool)`: the share of its engines that serve (None: not
        known)."""
        self._policy = policy
        self._engines_out = engines_out
        self._engines_up = engines_up
        self._engine_ttft = engine_ttft
        self._windows = windows
        self._kv = kv_cache_usage
        self._gpu = gpu_memory_usage
        self._queue = engine_queue
        self._clock = clock
        self.states: dict[str, BreakerState] = {}
        self.readings: dict[str, Reading] = {}
        # What the request path reads: recomputed by evaluate() and drill(), so a request
        # pays one dict lookup, not a walk over states and clocks.
        self._levels: dict[str, BreakerLevel] = {}
        self._probing: set[str] = set()

    def _state(self, name: str) -> BreakerState:
        state = self.states.get(name)
        thresholds = self._policy().breaker.thresholds
        if state is None:
            state = self.states[name] = BreakerState(name, thresholds, entered_s=self._clock())
        state.thresholds = thresholds  # a reloaded policy applies at once
        return state

    def signals(self, name: str) -> Signals:
        policy = self._policy()
        if name == GLOBAL:
            # The fleet as a whole: every pool failing, and this node's GPU memory.
            return Signals(
                error_rate=fleet_error_rate(self._windows, policy, self._engines_out),
                gpu_memory_usage=self._gpu(),
            )
        # The latency signal is the worse of two: the access log's (per tier and bucket,
        # this replica's requests, counted when each ends) and the engines' (the whole
        # pool's first tokens, every replica's, counted when each is out).
        logged = p99_over_slo(self._windows, policy, name)
        engines = engine_p99_over_slo(self._engine_ttft, policy, name)
        latency = max((v for v in (logged, engines) if v is not None), default=None)
        return Signals(
            p99_over_slo=latency,
            error_rate=error_rate(self._windows, policy, name, self._engines_out(name)),
            kv_cache_usage=self._kv(name),
            queue_ratio=self._queue(name),
            engines_up=self._engines_up(name),
        )

    def evaluate(self) -> list[Transition]:
        """Step every breaker once; the caller runs this every evaluate_interval_s."""
        now_s = self._clock()
        transitions = []
        pools = self._policy().pools
        for name in self.names():
            signals = self.signals(name)
            judged = signals
            spec = pools.get(name)
            if spec is not None and spec.kv_capacity_tokens and signals.kv_cache_usage is not None:
                # A pool with KV admission holds its cache to the tiers' shares by itself (a
                # stale engine reads as full there too: the ledger's ratio rises): a cache at
                # those shares is full by design, not a reason to halve sheddable budgets
                # (the controller's load score leaves it out alike, fleet_load).
                judged = dataclasses.replace(signals, kv_cache_usage=None)
            transition = step(self._state(name), judged, now_s)
            self.readings[name] = Reading(signals, transition)
            if transition is not None:
                transitions.append(transition)
        self._refresh(now_s)
        return transitions

    def _refresh(self, now_s: float) -> None:
        global_state = self._state(GLOBAL)
        global_level = global_state.effective_level(now_s)
        names = [n for n in self.names() if n != GLOBAL]
        self._levels = {
            name: max(self._state(name).effective_level(now_s), global_level) for name in names
        }
        self._levels[GLOBAL] = global_level
        self._probing = {
            name for name in names if self._state(name).probing or global_state.probing
        }

    def fleet_load(self) -> tuple[float | None, float | None]:
        """The quota controller's inputs: the load score of the most loaded pool (None
        without any signal) and the worst memory usage (KV cache or GPU), each pool's
        signals computed once."""
        config = self._policy().breaker
        scores: list[float] = []
        memory: list[float] = []
        for pool, spec in self._policy().pools.items():
            signals = self.signals(pool)
            # A pool with KV admission keeps its cache under the tiers' shares by itself;
            # the KV guard would only cut quotas for a cache that is full by design.
            kv_line = None if spec.kv_capacity_tokens else config.thresholds.l1_kv_cache
            score = load_score(
                signals.p99_over_slo,
                signals.kv_cache_usage,
                config.latency_weight,
                config.kv_weight,
                signals.queue_ratio,
                kv_line,
            )
            if score is not None:
                scores.append(score)
            if signals.kv_cache_usage is not None:
                memory.append(signals.kv_cache_usage)
        gpu = self._gpu()
        if gpu is not None:
            memory.append(gpu)
        return (max(scores) if scores else None), (max(memory) if memory else None)

    def names(self) -> Iterable[str]:
        return [*self._policy().pools, GLOBAL]

    def level(self, pool: str) -> BreakerLevel:
        """The level a request to `pool` meets: its pool's or the global one, whichever is
        higher (drills included), as of the last evaluation."""
        return self._levels.get(pool, BreakerLevel.L0)

    def probing(self, pool: str) -> bool:
        return pool in self._probing

    def retry_after_s(self, pool: str) -> float:
        """An honest hint for shed clients: the rest of the cool-down plus the probe hold."""
        state = self._state(pool)
        t = state.thresholds
        left_s = t.cooldown_s - (self._clock() - state.entered_s)
        return max(1.0, left_s) + t.probe_hold_s

    def drill(self, name: str, level: BreakerLevel, duration_s: float) -> None:
        now_s = self._clock()
        self._state(name).drill(level, now_s, duration_s)
        self._refresh(now_s)
