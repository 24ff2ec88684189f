"""The response path: one access-log entry per request, turned into a `RequestOutcome`.

What lives here (the entry's reading is extproc.service.outcomes, pure): `OutcomeRecorder`
(metrics, the breaker's signals through admission.signals, and the sinks: the admission
chain that settles the request, the decision log, the prompt feedback) and the grpc.aio
`AccessLogService` that Envoy streams batched entries to. The sinks take an outcome inline,
on the task that saw the request end; only the chain's settlement comes back, as an
awaitable: in this process it never waits and is awaited on the stream's task (no task);
through shared stores it is a task of its own (admission.chain.OutcomeSink says what may run
where). Python never sees response
chunks: usage and timings were extracted inside Envoy (see usage_tap.lua and
tooling.render.envoy_config.usage_tap).

Only slogate's own Envoy settles a request: an entry naming a request in flight settles it
only when it carries the id's proof (extproc.request.inflight), which the sidecar put in the
dynamic metadata Envoy copies into the entry. Whoever else reaches the port and learns an id
changes nothing (no refund, no 5xx for the breaker, no hold freed): the entry is counted
(slogate_access_log_unproven_total) and logged at most once a minute. The other ways a
request ends (its ext_proc stream's end, expiry) take the id from the sidecar's own objects,
never from a message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

import grpc

from admission.chain import OutcomeSink
from admission.decision import RequestOutcome, RoutingDecision, expired_outcome
from admission.signals import record_signals
from breaker.latency import ResponseWindows
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from extproc.request.inflight import InFlight
from extproc.service.metrics import SidecarMetrics
from extproc.service.outcomes import outcome_from_entry, tracking_id, usage_proof
from extproc.service.undelivered import UndeliveredReplies
from policy.schema import Policy

log = logging.getLogger("slogate.accesslog")

UNPROVEN_LOG_INTERVAL_S = 60.0  # unproven entries are logged at most this often (a flood: once)


async def _guarded(sink: OutcomeSink, waiting: Awaitable[None]) -> None:
    try:
        await waiting
    except Exception:  # one broken sink must not starve the others
        log.exception("outcome sink %r failed", sink)


async def finish(pending: Sequence[Awaitable[None]]) -> None:
    """Await sink work, in turn, on the caller's task (no task of its own): what waits for
    a store or another task is a task already, running concurrently with the rest
    (admission.chain.OutcomeSink); the rest finishes in this process without waiting."""
    for waiting in pending:
        await waiting


def _code_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


class OutcomeRecorder:
    """Matches entries to in-flight decisions; feeds metrics, latency windows and sinks."""

    def __init__(
        self,
        metrics: SidecarMetrics,
        windows: ResponseWindows,
        inflight: InFlight[RoutingDecision],
        policy: Callable[[], Policy],
        sinks: Sequence[OutcomeSink] = (),
        engines_out: Callable[[str], frozenset[str]] = lambda pool: frozenset(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`engines_out(pool)`: the pool's engines taken out of it, whose answers give the
        breaker no latency samples (admission.signals); `clock`: when unproven entries
        were last logged."""
        self.metrics = metrics
        self.windows = windows
        self.inflight = inflight
        self._policy = policy
        self.sinks = list(sinks)
        self._engines_out = engines_out
        self._clock = clock
        self._unproven_logged_s: float | None = None
        self._unproven_unlogged = 0
        self._undelivered: UndeliveredReplies[Callable[[RoutingDecision], RequestOutcome]] = (
            UndeliveredReplies()
        )

    def record_entry(self, entry: accesslog_pb2.HTTPAccessLogEntry) -> list[Awaitable[None]]:
        """Record one entry; returns the sinks' work, for the caller to await (batched)."""
        key = tracking_id(entry)
        if key is None:
            request_id = entry.request.request_id
            upstream = entry.common_properties.upstream_remote_address.socket_address.address
            if request_id and not upstream:
                suspect = self._undelivered.unrouted(request_id)
                if suspect is not None:
                    return self.ended(*suspect, kind="undelivered")
            self.metrics.access_log_entries("other").inc()
            status = entry.response.response_code.value
            details = entry.response.response_code_details
            if status >= 400 and details != "via_upstream" and not details.startswith("slogate_"):
                # Envoy answered itself (413 over the buffer limit, 503 sidecar down, ...).
                self.metrics.envoy_local_replies(str(status)).inc()
            return []
        # The proof before anything is touched. An entry naming no request in flight here
        # changes nothing either way (the id expired, or an earlier process issued it).
        known = key in self.inflight
        if known and not self.inflight.proven(key, usage_proof(entry)):
            self._unproven(key)
            return []
        decision = self.inflight.pop(key) if known else None
        if decision is None:
            # Expired before its entry came, or decided by an earlier sidecar process.
            self.metrics.access_log_entries("unmatched").inc()
            return []
        self.metrics.access_log_entries("routed").inc()
        self._undelivered.delivered(decision.request_id, key)
        try:
            outcome = outcome_from_entry(decision, key, entry)
        except Exception:
            # Out of the table already: an entry that cannot be read still ends its
            # request, as an expired one (what it holds given back, nothing charged for
            # usage it did not tell), or its holds would stay held for good.
            log.exception("could not read the access-log entry of %s", key)
            return self._to_sinks(expired_outcome(decision, key))
        return self.record(outcome)

    def _unproven(self, key: str) -> None:
        """An entry naming request `key` without its proof: counted, and logged with the
        ones before it at most once per UNPROVEN_LOG_INTERVAL_S."""
        self.metrics.access_log_unproven.inc()
        self._unproven_unlogged += 1
        now_s = self._clock()
        last_s = self._unproven_logged_s
        if last_s is not None and now_s - last_s < UNPROVEN_LOG_INTERVAL_S:
            return
        log.warning(
            "unproven access-log entries: %d since the last report, the last naming request "
            "%s in flight; they settled nothing. Something other than this sidecar's Envoy "
            "reaches its access-log service",
            self._unproven_unlogged,
            key,
        )
        self._unproven_logged_s = now_s
        self._unproven_unlogged = 0

    def ended(
        self,
        tracking: str,
        build: Callable[[RoutingDecision], RequestOutcome],
        kind: str = "stream_end",
    ) -> list[Awaitable[None]]:
        """A request whose end its ext_proc stream saw (streaming mode), or whose reply
        Envoy never took (`kind` undelivered): recorded as an access-log entry is, once
        (whichever of the two comes first takes the decision out of the in-flight table;
        the other finds nothing)."""
        decision = self.inflight.pop(tracking)
        if decision is None:
            return []
        self.metrics.access_log_entries(kind).inc()
        return self.record(build(decision))

    def maybe_undelivered(
        self, tracking: str, request_id: str, build: Callable[[RoutingDecision], RequestOutcome]
    ) -> list[Awaitable[None]]:
        """A request whose body reply grpc may not have handed to Envoy (its stream ended
        before grpc asked for more): ended now as `build` says where Envoy's entry without
        it came already; otherwise the entry to come decides (extproc.service.undelivered).
        A request without an id (not from Envoy) is ended now."""
        if not request_id or self._undelivered.suspect(request_id, tracking, build):
            return self.ended(tracking, build, kind="undelivered")
        return []

    async def expire(self) -> int:
        """Settle the requests whose entry never came (the safety net); returns how many."""
        expired = self.inflight.expire()
        self._undelivered.forget(self.inflight.__contains__)
        pending: list[Awaitable[None]] = []
        for tracking, decision in expired:
            self.metrics.inflight_expired.inc()
            pending.extend(self._to_sinks(expired_outcome(decision, tracking)))
        self.metrics.inflight.set(len(self.inflight))
        await finish(pending)
        return len(expired)

    def record(self, outcome: RequestOutcome) -> list[Awaitable[None]]:
        """Metrics and signals, then the sinks; returns what of their work waits (the
        settlement, which ends the request: its holds), whatever became of the rest."""
        try:
            self._observe(outcome)
        except Exception:  # the request's holds must not depend on its numbers
            log.exception("could not observe the outcome of %s", outcome.tracking_id)
        return self._to_sinks(outcome)

    def _observe(self, outcome: RequestOutcome) -> None:
        m = self.metrics
        d = outcome.decision
        pool, bucket, tier = d.pool, d.bucket.name, d.caller.tier.value
        m.responses(pool, _code_class(outcome.status)).inc()
        record_signals(self.windows, self._policy(), outcome, self._engines_out(pool))
        if outcome.status < 400 and d.meters_tokens:
            m.duration_seconds(pool, bucket, tier).observe(outcome.duration_s)
            if outcome.ttft_s is not None:
                # A stream's first body byte is its first token; a JSON answer's is all of it.
                m.ttft_seconds(pool, bucket, tier).observe(outcome.ttft_s)
                m.tenant_ttft_seconds(d.caller.tenant_label).observe(outcome.ttft_s)
            self._record_usage(outcome)

    def _to_sinks(self, outcome: RequestOutcome) -> list[Awaitable[None]]:
        """Each sink takes the outcome now, in order, on the caller's task (none waits
        there); what waits (the chain's settlement) is returned, to run after them all."""
        waiting: list[Awaitable[None]] = []
        for sink in self.sinks:
            try:
                rest = sink.record(outcome)
            except Exception:  # one broken sink must not starve the others
                log.exception("outcome sink %r failed", sink)
                continue
            if rest is not None:
                waiting.append(_guarded(sink, rest))
        return waiting

    def _record_usage(self, outcome: RequestOutcome) -> None:
        m = self.metrics
        d = outcome.decision
        pool, bucket = d.pool, d.bucket.name
        if outcome.prompt_tokens is not None:
            m.tokens(pool, bucket, "prompt").inc(outcome.prompt_tokens)
            if outcome.prompt_tokens > 0:
                m.estimate_ratio.observe(d.prompt_tokens / outcome.prompt_tokens)
        if outcome.completion_tokens is None:
            m.usage_missing(pool).inc()
            return
        m.tokens(pool, bucket, "completion").inc(outcome.completion_tokens)
        if outcome.ttft_s is not None and outcome.completion_tokens > 1:
            tpot_s = (outcome.duration_s - outcome.ttft_s) / (outcome.completion_tokens - 1)
            if tpot_s >= 0:
                m.tpot_seconds(pool, bucket).observe(tpot_s)
                self.windows.record_latency("tpot", pool, d.caller.tier.value, bucket, tpot_s)


class Forwarder(Protocol):
    """Where the entries of requests another worker decided go (extproc.runtime.workers)."""

    @property
    def own(self) -> int: ...

    def owner_of(self, tracking: str) -> int | None: ...

    async def forward(
        self, index: int, entries: list[accesslog_pb2.HTTPAccessLogEntry]
    ) -> None: ...


class AccessLogService(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self, recorder: OutcomeRecorder, forwarder: Forwarder | None = None) -> None:
        self._recorder = recorder
        self._forwarder = forwarder

    def _split(
        self, entries: Sequence[accesslog_pb2.HTTPAccessLogEntry]
    ) -> tuple[
        list[accesslog_pb2.HTTPAccessLogEntry], dict[int, list[accesslog_pb2.HTTPAccessLogEntry]]
    ]:
        """This worker's entries, and the others' by worker."""
        forwarder = self._forwarder
        if forwarder is None:
            return list(entries), {}
        mine: list[accesslog_pb2.HTTPAccessLogEntry] = []
        theirs: dict[int, list[accesslog_pb2.HTTPAccessLogEntry]] = {}
        for entry in entries:
            key = tracking_id(entry)
            owner = None if key is None else forwarder.owner_of(key)
            if owner is None or owner == forwarder.own:
                mine.append(entry)
            else:
                theirs.setdefault(owner, []).append(entry)
        return mine, theirs

    async def StreamAccessLogs(
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext,
    ) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            pending: list[Awaitable[None]] = []
            mine, theirs = self._split(message.http_logs.log_entry)
            if theirs and self._forwarder is not None:
                forward = self._forwarder.forward
                # Round trips to the other workers: tasks, concurrent with the settlements.
                pending.extend(
                    asyncio.ensure_future(forward(index, entries))
                    for index, entries in theirs.items()
                )
            for entry in mine:
                try:
                    pending.extend(self._recorder.record_entry(entry))
                except Exception:  # a malformed entry must not end the stream for the rest
                    log.exception("could not record an access-log entry")
            # Settlements through Redis run concurrently (tasks: one round trip each).
            await finish(pending)
        return als_pb2.StreamAccessLogsResponse()
