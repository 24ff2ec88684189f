"""Access-log entries -> outcomes -> metrics, windows and sinks, without Envoy or gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, cast

import pytest

from admission.decision import CountKind, RequestOutcome, RoutingDecision
from breaker.latency import ResponseWindows
from extproc.envoypb.envoy.data.accesslog.v3 import accesslog_pb2
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.request.inflight import InFlight
from extproc.service import access_log, outcomes
from extproc.service.access_log import AccessLogService, OutcomeRecorder, finish
from extproc.service.metrics import SidecarMetrics
from extproc.service.outcomes import outcome_from_entry
from policy.domain import ApiKey, ContextBucket, Tier
from policy.loader import parse_policy
from tests.support.clock import VirtualClock

POLICY = parse_policy({})

DECISION = RoutingDecision(
    request_id="r1",
    caller=ApiKey("ab" * 32, "t", Tier.CRITICAL),
    pool="long",
    bucket=ContextBucket("32k-128k", 32769, 131072, 2.5),
    prompt_tokens=41000,
    max_tokens=16,
    estimate=CountKind.EXACT,
    stream=False,
)


def entry(
    status: int = 200,
    tags: dict[str, str] | None = None,
    tracking: str | None = None,
    duration_ms: int = 900,
    details: str = "via_upstream",
    proof: str | None = None,
    request_id: str = "",
    upstream: str = "",
) -> accesslog_pb2.HTTPAccessLogEntry:
    """An entry as Envoy sends it; `proof`: the one it carries of `tracking` (see
    `proven`, which gives an in-flight request's own); `upstream`: the engine's address
    ("": the request reached none)."""
    e = accesslog_pb2.HTTPAccessLogEntry()
    e.request.request_id = request_id
    if upstream:
        e.common_properties.upstream_remote_address.socket_address.address = upstream
    e.response.response_code.value = status
    e.response.response_code_details = details
    e.common_properties.duration.FromMilliseconds(duration_ms)
    for k, v in (tags or {}).items():
        e.common_properties.custom_tags[k] = v
    if tracking is not None:
        e.common_properties.metadata.filter_metadata["slogate"].update({"id": tracking})
    if proof is not None:
        e.common_properties.metadata.filter_metadata["slogate"].update({"proof": proof})
    return e


def proven(
    inflight: InFlight[RoutingDecision], tracking: str, **fields: Any
) -> accesslog_pb2.HTTPAccessLogEntry:
    """The entry of in-flight request `tracking` as the sidecar's own Envoy writes it: with
    the proof the sidecar put in its metadata."""
    return entry(tracking=tracking, proof=inflight.proof(tracking), **fields)


def test_entry_becomes_outcome_of_its_decision() -> None:
    tags = {"ttft_ms": "120", "prompt_tokens": "40000", "completion_tokens": "16"}
    outcome = outcome_from_entry(DECISION, "t1", entry(tags=tags))
    assert outcome.decision is DECISION
    assert outcome.prompt_tokens == 40000 and outcome.completion_tokens == 16
    assert outcome.ttft_s == 0.12 and outcome.duration_s == 0.9 and outcome.has_usage


@pytest.mark.parametrize(
    ("first_byte_ms", "delay_ms", "ttft_s"),
    [
        ("4", "310", 0.314),  # a Responses stream: its first bytes came before any token
        ("120", "0", 0.12),  # a chat stream: its first chunk carried output
        ("120", "-", 0.12),  # no output event seen (a JSON answer; a tap that does not time)
        ("120", "-3", 0.12),  # Envoy's wall clock stepped back: not believed
        ("-", "310", None),  # no first byte, no TTFT
        ("880", "30", 0.9),  # the sum never passes the request's end (two clocks, ms each)
    ],
)
def test_ttft_is_timed_at_the_first_output_event_where_the_tap_saw_one(
    first_byte_ms: str, delay_ms: str, ttft_s: float | None
) -> None:
    tags = {"ttft_ms": first_byte_ms, "first_output_delay_ms": delay_ms}
    outcome = outcome_from_entry(DECISION, "t1", entry(tags=tags, duration_ms=900))
    assert outcome.ttft_s == (None if ttft_s is None else pytest.approx(ttft_s))


def test_missing_tags_mean_not_reported() -> None:
    outcome = outcome_from_entry(
        DECISION, "t1", entry(tags={"ttft_ms": "-", "completion_tokens": "x"})
    )
    assert outcome.ttft_s is None and outcome.completion_tokens is None
    assert not outcome.has_usage


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (None, None),  # no such tag
        ("", None),
        ("-", None),  # Envoy's absent
        ("-5", None),
        ("x", None),
        ("inf", None),
        ("1e400", None),
        ("12.7", 12),
        ("0", 0),
        (str(2**31 - 1), 2**31 - 1),
        (str(2**31), None),  # over what an engine reports
    ],
)
def test_a_tag_reads_as_a_count_or_not_reported(value: str | None, read: int | None) -> None:
    tags = {} if value is None else {"completion_tokens": value}
    assert outcomes._tag_int(tags, "completion_tokens") == read


class Sink:
    """A sink that never waits (the engine picker, the metrics, the decision log)."""

    def __init__(self) -> None:
        self.seen: list[RequestOutcome] = []

    def record(self, outcome: RequestOutcome) -> None:
        self.seen.append(outcome)


class BrokenSink:
    def record(self, outcome: RequestOutcome) -> None:
        raise RuntimeError("boom")


class SettlingSink:
    """A sink whose work is left to await: a settlement against this process's stores (a
    coroutine that never waits), or through a shared store (`apart`: a task of its own,
    waiting until `done`)."""

    def __init__(self, apart: bool = False, broken: bool = False) -> None:
        self.done = asyncio.Event()
        if not apart:
            self.done.set()
        self.settled: list[RequestOutcome] = []
        self.tasks: list[asyncio.Task[Any] | None] = []
        self._apart = apart
        self._broken = broken

    def record(self, outcome: RequestOutcome) -> Awaitable[None]:
        settling = self._settle(outcome)
        return asyncio.ensure_future(settling) if self._apart else settling

    async def _settle(self, outcome: RequestOutcome) -> None:
        self.tasks.append(asyncio.current_task())
        await self.done.wait()
        if self._broken:
            raise RuntimeError("the store broke")
        self.settled.append(outcome)


def recorder(
    *settling: SettlingSink,
) -> tuple[OutcomeRecorder, InFlight[RoutingDecision], Sink, VirtualClock]:
    clock = VirtualClock(100.0)
    inflight: InFlight[RoutingDecision] = InFlight(clock, ttl_s=60)
    sink = Sink()
    rec = OutcomeRecorder(
        SidecarMetrics(),
        ResponseWindows(clock),
        inflight,
        lambda: POLICY,
        [*settling, BrokenSink(), sink],
        clock=clock,
    )
    return rec, inflight, sink, clock


async def test_sinks_that_never_wait_take_the_outcome_at_once_whatever_the_others_do() -> None:
    """The sinks that never wait run inline, before any settlement: a broken one (sync or
    waiting) stops none of the others, and a slow settlement holds none of them back."""
    slow, broken = SettlingSink(apart=True), SettlingSink(broken=True)
    rec, inflight, sink, _ = recorder(broken, slow)
    tracking = inflight.add(DECISION)
    pending = rec.record_entry(proven(inflight, tracking))
    assert len(pending) == 2  # only the waiting sinks' work comes back
    assert [o.tracking_id for o in sink.seen] == [tracking]  # past the broken sink, at once
    settling = asyncio.ensure_future(finish(pending))
    await asyncio.sleep(0)
    assert not settling.done() and slow.settled == []
    slow.done.set()
    broken.done.set()
    await settling  # the broken settlement was logged, not raised
    assert [o.tracking_id for o in slow.settled] == [tracking]


async def _batches(
    *batches: list[accesslog_pb2.HTTPAccessLogEntry],
) -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
    for entries in batches:
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.extend(entries)
        yield message


@contextlib.contextmanager
def new_tasks() -> Iterator[list[asyncio.Task[Any]]]:
    """The tasks the running event loop creates inside the block."""
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(None)


@pytest.mark.parametrize("apart", [False, True], ids=["in-process", "shared"])
async def test_settlements_cost_a_task_only_where_they_wait(apart: bool) -> None:
    """A settlement that never waits (this process's stores) runs on the stream's task, a
    batch's in turn: no task; one through a shared store is a task of its own, a batch's
    concurrently. The sinks that never wait cost none either way."""
    settling = SettlingSink(apart=apart)
    rec, inflight, sink, _ = recorder(settling)
    service = AccessLogService(rec)
    context = cast(Any, None)
    for size in (1, 3):
        batch = [proven(inflight, inflight.add(DECISION)) for _ in range(size)]
        with new_tasks() as created:
            stream = asyncio.ensure_future(service.StreamAccessLogs(_batches(batch), context))
            await asyncio.sleep(0)
            settling.done.set()
            await stream
        created.remove(stream)
        assert len(created) == (size if apart else 0)
        assert all((task is stream) is not apart for task in settling.tasks[-size:])
    assert len(sink.seen) == len(settling.settled) == 4 and len(inflight) == 0


async def test_recorder_feeds_metrics_windows_and_sinks() -> None:
    rec, inflight, sink, _ = recorder()
    ok, failed = inflight.add(DECISION), inflight.add(DECISION)
    tags = {"ttft_ms": "100", "prompt_tokens": "40000", "completion_tokens": "11"}
    pending = rec.record_entry(proven(inflight, ok, tags=tags))
    pending += rec.record_entry(proven(inflight, failed, status=503))
    pending += rec.record_entry(entry(status=413, details="request_payload_too_large"))
    pending += rec.record_entry(entry(status=404))  # an upstream 404, non-inference path
    pending += rec.record_entry(proven(inflight, ok))  # a duplicate: its decision is gone
    await finish(pending)
    value = rec.metrics.registry.get_sample_value
    labels = {"pool": "long", "bucket": "32k-128k"}
    assert value("slogate_tokens_total", {**labels, "kind": "completion"}) == 11
    assert value("slogate_upstream_ttft_seconds_count", {**labels, "tier": "critical"}) == 1
    assert value("slogate_responses_total", {"pool": "long", "code_class": "5xx"}) == 1
    assert value("slogate_envoy_local_replies_total", {"status": "413"}) == 1
    assert value("slogate_envoy_local_replies_total", {"status": "404"}) is None
    assert value("slogate_access_log_entries_total", {"kind": "unmatched"}) == 1
    # tpot = (0.9 s - 0.1 s) / (11 - 1)
    assert value("slogate_upstream_time_per_output_token_seconds_sum", labels) == 0.08
    assert rec.windows.error_rate("long", 60) == 0.5
    assert rec.windows.merged("ttft", 60, pool="long").quantile(0.5) is not None
    assert [o.status for o in sink.seen] == [200, 503]  # the broken sink did not stop it
    assert len(inflight) == 0


async def test_requests_without_an_entry_expire_and_reach_sinks() -> None:
    rec, inflight, sink, clock = recorder()
    inflight.add(DECISION)
    clock.now_s += 30
    late = inflight.add(DECISION)
    assert await rec.expire() == 0
    clock.now_s += 31  # the first is now 61 s old, the second 31 s
    assert await rec.expire() == 1
    assert len(sink.seen) == 1 and sink.seen[0].expired and not sink.seen[0].has_usage
    assert rec.metrics.registry.get_sample_value("slogate_inflight_expired_total") == 1
    assert rec.metrics.registry.get_sample_value("slogate_inflight_requests") == 1
    await finish(rec.record_entry(proven(inflight, late)))
    assert len(inflight) == 0


def test_inflight_ids_are_unique_and_pop_once() -> None:
    table: InFlight[int] = InFlight(VirtualClock(100.0), ttl_s=1)
    ids = {table.add(i) for i in range(1000)}
    assert len(ids) == 1000
    key = next(iter(ids))
    assert table.pop(key) is not None and table.pop(key) is None


async def test_an_infinite_count_is_not_reported_and_its_request_is_settled() -> None:
    """Found by the fuzzer (tooling.fuzz): a count that reads as infinite ("inf", "1e400",
    a usage tap's copy of an engine's 1e400) raised OverflowError after the entry's
    decision left the in-flight table: its KV hold and budget reservation stayed held for
    good (not even expiry could find them)."""
    rec, inflight, sink, _ = recorder()
    tracking = inflight.add(DECISION)
    tags = {"prompt_tokens": "1e400", "completion_tokens": "inf", "reasoning_tokens": "9" * 400}
    await finish(rec.record_entry(proven(inflight, tracking, tags=tags)))
    (outcome,) = sink.seen
    assert outcome.prompt_tokens is None and outcome.completion_tokens is None
    assert outcome.reasoning_tokens is None and len(inflight) == 0


async def test_an_entry_that_cannot_be_read_still_ends_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The net behind the fix above: whatever an entry makes the reading raise, its
    request is ended as an expired one is, its holds given back through the sinks."""
    rec, inflight, sink, _ = recorder()
    tracking = inflight.add(DECISION)

    def unreadable(*_: object) -> RequestOutcome:
        raise RuntimeError("an entry no one foresaw")

    monkeypatch.setattr(access_log, "outcome_from_entry", unreadable)
    await finish(rec.record_entry(proven(inflight, tracking)))
    assert [o.expired for o in sink.seen] == [True] and len(inflight) == 0


def test_a_count_no_request_could_make_is_not_believed() -> None:
    """Noticed by the fuzzer: "1e300" tokens was charged to the tenant's budgets. More
    than two billion is a broken or hostile report, not usage: read as not reported, the
    sidecar's own count settles; two billion itself is still a count."""
    tags = {"prompt_tokens": "1e300", "completion_tokens": str(2**31), "ttft_ms": "1e20"}
    outcome = outcome_from_entry(DECISION, "t1", entry(tags=tags))
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.ttft_s) == (None,) * 3
    edge = outcome_from_entry(DECISION, "t1", entry(tags={"prompt_tokens": str(2**31 - 1)}))
    assert edge.prompt_tokens == 2**31 - 1


def test_a_negative_duration_is_not_believed() -> None:
    """Found by the fuzzer: an entry saying its request took -3,019,426 s made the KV
    step's settlement raise (its decay, 0.5 ** (duration / half-life), overflowed)."""
    assert outcome_from_entry(DECISION, "t1", entry(duration_ms=-3_019_426_000)).duration_s == 0


async def test_a_ttft_past_every_bin_is_recorded_and_its_request_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the fuzzer: a `ttft_ms` of "1e308" overflowed the latency window's bins
    after the entry's decision left the in-flight table, before the sinks: its holds
    stayed held for good. The sinks now run whatever the metrics and signals do."""
    rec, inflight, sink, _ = recorder()
    tracking = inflight.add(DECISION)
    await finish(rec.record_entry(proven(inflight, tracking, tags={"ttft_ms": "1e308"})))
    assert len(sink.seen) == 1 and len(inflight) == 0

    def broken(*_: object) -> None:
        raise RuntimeError("a signal no one foresaw")

    monkeypatch.setattr(access_log, "record_signals", broken)
    tracking = inflight.add(DECISION)
    await finish(rec.record_entry(proven(inflight, tracking)))
    assert len(sink.seen) == 2 and len(inflight) == 0


@pytest.mark.parametrize(
    "proof",
    [None, "", "0" * 32, "not hex at all", "é"],
    ids=["missing", "empty", "wrong", "garbage", "not-ascii"],
)
async def test_an_entry_without_its_proof_settles_nothing(proof: str | None) -> None:
    """A forged 503 naming a real in-flight id: no outcome, no 5xx for the breaker, the
    request still in flight (its holds kept), and counted."""
    rec, inflight, sink, _ = recorder()
    key = inflight.add(DECISION)
    await finish(rec.record_entry(entry(status=503, tracking=key, proof=proof)))
    value = rec.metrics.registry.get_sample_value
    assert sink.seen == [] and key in inflight
    assert rec.windows.error_rate("long", 60) is None
    assert value("slogate_responses_total", {"pool": "long", "code_class": "5xx"}) is None
    assert value("slogate_access_log_unproven_total") == 1
    assert value("slogate_access_log_entries_total", {"kind": "routed"}) is None
    # ... and the request's own entry still settles it.
    await finish(rec.record_entry(proven(inflight, key)))
    assert [o.status for o in sink.seen] == [200] and key not in inflight


async def test_the_proof_of_another_request_settles_nothing() -> None:
    rec, inflight, sink, _ = recorder()
    mine, theirs = inflight.add(DECISION), inflight.add(DECISION)
    await finish(rec.record_entry(entry(status=503, tracking=theirs, proof=inflight.proof(mine))))
    assert sink.seen == [] and theirs in inflight and mine in inflight
    assert rec.metrics.registry.get_sample_value("slogate_access_log_unproven_total") == 1


async def test_an_entry_naming_no_request_in_flight_is_unmatched_not_unproven() -> None:
    """An id this process never issued or no longer holds (an earlier process's, after a
    restart; one expired): nothing to settle, and no alarm."""
    rec, _, sink, _ = recorder()
    await finish(rec.record_entry(entry(tracking="0badc0de-1", proof="0" * 32)))
    value = rec.metrics.registry.get_sample_value
    assert sink.seen == [] and value("slogate_access_log_unproven_total") == 0
    assert value("slogate_access_log_entries_total", {"kind": "unmatched"}) == 1


async def test_unproven_entries_are_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec, inflight, _, clock = recorder()
    keys = [inflight.add(DECISION) for _ in range(4)]
    with caplog.at_level(logging.WARNING, logger="slogate.accesslog"):
        for key in keys[:3]:  # a flood: the first is logged, the next two wait
            rec.record_entry(entry(tracking=key))
        clock.now_s += 61
        rec.record_entry(entry(tracking=keys[3]))  # a minute on: logged, with the two
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert warnings[0].startswith("unproven access-log entries: 1 ") and keys[0] in warnings[0]
    assert warnings[1].startswith("unproven access-log entries: 3 ") and keys[3] in warnings[1]
    assert rec.metrics.registry.get_sample_value("slogate_access_log_unproven_total") == 4


def _nothing_used(tracking: str, decision: RoutingDecision) -> RequestOutcome:
    return RequestOutcome(decision, tracking, 0, None, None, None, 0.0, "ext_proc_stream_closed")


async def test_a_reply_envoy_took_before_closing_the_stream_is_settled_by_its_entry() -> None:
    """The stream ended before grpc asked for more, but Envoy had the reply (an engine's
    instant 404 closed it): the entry with the tracking id settles it with its usage."""
    rec, inflight, sink, _ = recorder()
    key = inflight.add(DECISION)
    assert rec.maybe_undelivered(key, "r1", functools.partial(_nothing_used, key)) == []
    assert key in inflight  # not ended on a guess
    tags = {"prompt_tokens": "41000", "completion_tokens": "3"}
    await finish(rec.record_entry(proven(inflight, key, tags=tags, request_id="r1")))
    assert [o.completion_tokens for o in sink.seen] == [3]
    value = rec.metrics.registry.get_sample_value
    assert value("slogate_access_log_entries_total", {"kind": "routed"}) == 1
    assert value("slogate_access_log_entries_total", {"kind": "undelivered"}) is None
    # An unrouted entry of the same id later (a client reusing it) ends nothing.
    await finish(
        rec.record_entry(entry(status=0, details="downstream_remote_disconnect", request_id="r1"))
    )
    assert len(sink.seen) == 1


@pytest.mark.parametrize("entry_first", [False, True])
async def test_a_reply_envoy_never_took_ends_at_the_entry_without_an_upstream(
    entry_first: bool,
) -> None:
    """The client left as the room let its request in: Envoy's entry names the request
    but not the decision, and no engine; it ends the decision with nothing used, whether
    it comes before or after the servicer's suspicion."""
    rec, inflight, sink, _ = recorder()
    key, other = inflight.add(DECISION), inflight.add(DECISION)
    gone = entry(status=0, details="downstream_remote_disconnect", request_id="r1")
    ending = functools.partial(_nothing_used, key)
    if entry_first:
        await finish(rec.record_entry(gone))
        await finish(rec.maybe_undelivered(key, "r1", ending))
    else:
        await finish(rec.maybe_undelivered(key, "r1", ending))
        assert key in inflight
        # Another request's entries (one answered upstream, one of another id) end nothing.
        await finish(rec.record_entry(entry(status=404, request_id="r1", upstream="10.0.0.9")))
        await finish(rec.record_entry(entry(status=0, request_id="r2")))
        assert key in inflight
        await finish(rec.record_entry(gone))
    assert key not in inflight and other in inflight
    assert [o.tracking_id for o in sink.seen] == [key] and not sink.seen[0].has_usage
    value = rec.metrics.registry.get_sample_value
    assert value("slogate_access_log_entries_total", {"kind": "undelivered"}) == 1


async def test_a_suspect_whose_entry_never_comes_expires_and_is_forgotten() -> None:
    rec, inflight, sink, clock = recorder()
    key = inflight.add(DECISION)
    await finish(rec.maybe_undelivered(key, "r1", functools.partial(_nothing_used, key)))
    clock.now_s += 61
    assert await rec.expire() == 1
    assert len(rec._undelivered) == 0
    assert sink.seen[0].expired
