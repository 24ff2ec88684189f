"""One request's way through the offline fleet once a sidecar decided it: the engine, its
latencies and what the access log says of it.

What lives here: `FleetRequests`, the part of sim.fleet.offline's `OfflineFleet` that takes a
sidecar's decision (a refusal, retried as a client would, or a route to an engine), starts
the request on its engine with its own draws (or a replayed record's timings), finishes it
and hands its outcome back as Envoy's access log would: the breaker's signals, then
settlement in every admission step. The fleet's state and its event loop are sim.fleet.offline's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping

from admission.crossing import crossed_to
from admission.decision import RequestOutcome
from admission.errors import RequestRejected
from admission.signals import record_signals
from breaker.latency import ResponseWindows
from engines.kv_events import EventBatch
from extproc.request.routing import engine_priority
from extproc.request.verdicts import Routed
from policy.schema import Policy
from sim.fleet.arrivals import Arrival, RecordedAnswer, own_draws
from sim.fleet.clock import VirtualClock
from sim.fleet.engine_pool import EnginePool, SimEngine
from sim.fleet.fleet_types import RETRIED_STATUSES, Served
from sim.fleet.prompt_ids import prompt_plan
from sim.fleet.sidecar import SimulatedSidecar
from sim.server.model import (
    EngineAdmission,
    LatencyConfig,
    LatencyModel,
    chain_segments,
    kv_tokens_for,
)
from sim.server.paged_kv import PagedKvCache


class FleetRequests:
    """The request steps of `OfflineFleet`, which sets every attribute below."""

    policy: Policy
    client_retries: int
    seed: int
    clock: VirtualClock
    latency: LatencyConfig
    overcommit_error_rate: float
    engines: dict[str, EnginePool]
    windows: ResponseWindows
    sidecars: list[SimulatedSidecar]
    retried: int
    oom_events: int
    results: dict[str, Served]
    _on_engine: dict[str, SimEngine]
    _attempts: dict[str, int]
    _attempt_at: dict[str, float]
    _sidecar_of: dict[str, int]
    _routed: dict[str, Routed]
    _outputs: dict[str, int]
    _arrivals: dict[str, Arrival]
    _events: list[tuple[float, int, str, str]]
    kv_events_delay_s: float | None
    prefill_queue: bool
    _batches: dict[int, tuple[str, EventBatch]]
    _pool_of: dict[str, str]
    _sequence: itertools.count[int]
    cross_out: Callable[[str, str, Mapping[str, str]], None] | None
    _from_peer: dict[str, Callable[[Served, int], None]]

    def _push(self, at_s: float, kind: str, request_id: str) -> None:
        heapq.heappush(self._events, (at_s, next(self._sequence), kind, request_id))

    def _decided(self, request_id: str, decided: Routed | RequestRejected) -> None:
        arrival = self._arrivals[request_id]
        attempts = self._attempts[request_id]
        if isinstance(decided, RequestRejected):
            retry_s = decided.retry_after_s
            retryable = retry_s is not None and decided.status in RETRIED_STATUSES
            if retryable and attempts <= self.client_retries:
                self._push(self.clock.now_s + (retry_s or 0), "arrive", request_id)
                return
            pool = self.policy.pool_for(arrival.counted + arrival.max_tokens)
            kind = SimulatedSidecar.kind(decided)
            self.results[request_id] = Served(
                arrival, pool, kind, attempts=attempts, reason=decided.reason
            )
            self._tell_origin(request_id, decided.status)
            return
        self._routed[request_id] = decided
        pool = decided.decision.pool
        peer = crossed_to(pool)
        if peer is not None and self.cross_out is not None:
            # Re-routed to a peer region (admission.crossing): Envoy's route takes it there
            # with its token; its answer comes back through this region's access log.
            waited_s = self.clock.now_s - self._attempt_at[request_id]
            self.results[request_id] = Served(
                arrival, pool, "crossed", waited_s=waited_s, attempts=attempts
            )
            self.cross_out(request_id, peer, decided.upstream_headers)
            return
        detect_s = self.policy.engines.health.probe_interval_s * (
            self.policy.engines.health.unhealthy_after
        )
        engine, retried = self.engines[pool].reach(
            decided.decision.engines, self.clock.now_s, detect_s
        )
        self.retried += retried
        waited_s = self.clock.now_s - self._attempt_at[request_id]
        self.results[request_id] = Served(
            arrival, pool, "served", waited_s=waited_s, attempts=attempts
        )
        if engine is None:  # refused, and its retry too: Envoy's 503
            self.results[request_id].outcome = "engine_lost"
            self._end(request_id, status=503, output=None)
            return
        # What the engine will hold: the prompt and the tokens it will really generate (vLLM
        # grows a request's cache as it decodes; it never sets max_tokens aside). The
        # sidecar's ledger counts prompt + max_tokens: an upper bound, as in production.
        output = self._outputs[request_id] = self._output_tokens(arrival)
        kv_tokens = kv_tokens_for(arrival.prompt_tokens, output, self.latency.buckets)
        engine.served += 1
        self._on_engine[request_id] = engine
        spec = self.policy.pools[pool]
        # What the sidecar wrote into the body for an engine that schedules by priority.
        priority = engine_priority(arrival.key.tier) if spec.priority_scheduling else 0
        if isinstance(engine.kv, PagedKvCache):
            engine.kv.plan(request_id, prompt_plan(arrival, output, engine.kv.block_size))
        admission = engine.kv.submit(request_id, kv_tokens, priority)
        self._published(engine)
        if admission is EngineAdmission.ADMITTED:
            self._start(request_id, engine)
        elif admission is EngineAdmission.QUEUED:
            engine.waiting[request_id] = (kv_tokens, arrival)
        else:
            self.results[request_id].outcome = "engine_full"
            self._outputs.pop(request_id, None)
            self._on_engine.pop(request_id, None)
            self._end(request_id, status=503, output=None, engine=engine)

    def _tell_origin(self, request_id: str, status: int) -> None:
        """A request a peer sent here ended: its origin hears of it."""
        on_end = self._from_peer.pop(request_id, None)
        if on_end is not None:
            on_end(self.results[request_id], status)

    def answered_by_peer(
        self, request_id: str, at_peer: Served, status: int, first_byte_s: float | None
    ) -> None:
        """The answer to a request this region sent to a peer is back now (`first_byte_s`:
        when its first token reached this region; None: it failed there): the client's
        result, then the access log's entry for it, as for one served here."""
        served = self.results[request_id]
        served.done_s = self.clock.now_s
        served.output_tokens = at_peer.output_tokens
        if first_byte_s is not None:
            served.ttft_s = first_byte_s - served.arrival.at_s
        if status >= 400:
            served.outcome = f"crossed_{at_peer.outcome}"
        output = at_peer.output_tokens if status < 400 else None
        self._end(request_id, status, output)

    def _published(self, engine: SimEngine) -> None:
        """What the engine's paged cache stored, evicted or cleared since last asked, as one
        batch of its KV events, handed to every sidecar's picker `kv_events_delay_s` later
        (ZMQ and the subscriber's loop in production); dropped when the engines do not
        publish (`kv_events_delay_s` None)."""
        if not isinstance(engine.kv, PagedKvCache) or not engine.kv.events:
            return
        events = engine.kv.drain_events()
        if self.kv_events_delay_s is None:
            return
        number = next(self._sequence)
        now_s = self.clock.now_s
        self._batches[number] = (engine.address, EventBatch(now_s, tuple(events)))
        self._push(now_s + self.kv_events_delay_s, "kv", str(number))

    def _deliver(self, number: int) -> None:
        address, batch = self._batches.pop(number)
        pool = self._pool_of[address]
        for sidecar in self.sidecars:
            sidecar.picker.kv_events(pool, address, batch)

    def _output_tokens(self, arrival: Arrival) -> int:
        """How long the model 'wants' to answer, from the request's own generator (or
        what it really answered, for a replayed record)."""
        if arrival.output_tokens is not None:
            return min(arrival.output_tokens, max(arrival.max_tokens, 1))
        draws = own_draws(self.seed, arrival, 1)
        return LatencyModel(self.latency, draws).sample_output_tokens(arrival.max_tokens)

    def _start(self, request_id: str, engine: SimEngine) -> None:
        arrival = self._arrivals[request_id]
        engine.waiting.pop(request_id, None)
        draws = own_draws(self.seed, arrival)
        model = LatencyModel(self.latency, draws)
        running = engine.kv.num_running
        segments = chain_segments(list(zip(arrival.texts, arrival.text_tokens, strict=True)))
        cached = engine.look_up(segments, arrival.prompt_tokens, request_id)
        ttft_s = model.sample_ttft_s(arrival.prompt_tokens, running, cached)
        if self.prefill_queue:
            # Its prefill waits for the prefills started before it on this engine: a prompt
            # not cached costs the engine's compute, not only its own TTFT.
            now_s = self.clock.now_s
            waited_s = max(0.0, engine.prefill_free_s - now_s)
            engine.prefill_free_s = (
                now_s + waited_s + model.prefill_s(arrival.prompt_tokens, cached)
            )
            ttft_s += waited_s
        served = self.results[request_id]
        served.cached_tokens = cached
        if arrival.answer is not None:
            self._start_recorded(request_id, arrival.answer)
            return
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

    def _start_recorded(self, request_id: str, answer: RecordedAnswer) -> None:
        """A replayed record: its first byte and its end when the real engine's came (or
        now, when the simulated engine started it later than that)."""
        arrival = self._arrivals[request_id]
        served = self.results[request_id]
        now_s = self.clock.now_s
        served.done_s = max(now_s, arrival.at_s + answer.duration_s)
        first_s = answer.duration_s if answer.ttft_s is None else answer.ttft_s
        served.ttft_s = min(max(now_s, arrival.at_s + first_s), served.done_s) - arrival.at_s
        served.output_tokens = self._outputs[request_id]
        self._push(served.done_s, "finish", request_id)

    def _finish(self, request_id: str) -> None:
        engine = self._on_engine.pop(request_id, None)
        if engine is None:
            return  # lost with its engine, and ended then
        served = self.results[request_id]
        for started in engine.kv.release(request_id):
            self._start(started, engine)
        self._published(engine)
        output = self._outputs.pop(request_id)
        if served.outcome == "oom":
            self.oom_events += 1
            self._end(request_id, status=500, output=None, engine=engine)  # refunded
            return
        answer = served.arrival.answer
        status = 200 if answer is None else answer.status
        self._end(request_id, status, output if status < 400 else None, engine=engine)

    def _end(
        self, request_id: str, status: int, output: int | None, engine: SimEngine | None = None
    ) -> None:
        """What Envoy's access log would say of the request, handed back as the sidecar
        takes it: the breaker's signals, then settlement in every admission step."""
        served = self.results[request_id]
        routed = self._routed.pop(request_id)
        arrival = served.arrival
        # Envoy times each attempt from its own start (a retry is a new request to it).
        started_s = self._attempt_at[request_id]
        duration_s = (served.done_s or self.clock.now_s) - started_s
        ttft_s = None if served.ttft_s is None else served.ttft_s - (started_s - arrival.at_s)
        outcome = RequestOutcome(
            decision=routed.decision,
            tracking_id=routed.tracking_id,
            status=status,
            prompt_tokens=arrival.prompt_tokens if output is not None else None,
            completion_tokens=output,
            # A stream's first byte is its first token; a JSON answer's first byte its end.
            ttft_s=ttft_s if arrival.stream else duration_s,
            duration_s=duration_s,
            details="via_upstream",
            upstream=engine.address if engine is not None else "",
            upstream_failed=status == 503 and engine is not None and not engine.up,
        )
        # The engines out as the sidecar's access log sees them (admission.signals).
        pool = routed.decision.pool
        out = frozenset() if crossed_to(pool) is not None else self.sidecars[0].fleet.out(pool)
        record_signals(self.windows, self.policy, outcome, out)
        self.sidecars[self._sidecar_of.get(request_id, 0)].finish(outcome)
        self._tell_origin(request_id, status)
