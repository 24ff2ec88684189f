"""The sidecar under fuzz: a real `Sidecar` on its own event loop in a thread of this
process, spoken to over real gRPC on 127.0.0.1 (a free port) by blocking clients, so a
fuzzer that is not asynchronous (hypothesis) drives it example by example.

What lives here: `FuzzTarget` (start, stop, one ext_proc stream, one access-log stream,
settling what was routed as Envoy's access log would, and what is still held) and the
records of one exchange. What a reply must be is tooling.fuzz.properties'.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import struct_pb2

from admission.decision import RequestOutcome, RoutingDecision
from extproc.envoypb.envoy.service.accesslog.v3 import als_pb2
from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc.request.contract import ACCESS_LOG_NAME, METADATA_NAMESPACE, TRACKING_ID_FIELD
from extproc.request.response_usage import ResponseUsage
from extproc.runtime.sidecar import Sidecar
from extproc.service.access_log import finish
from extproc.service.outcomes import outcome_from_stream
from tooling.fuzz.seeds import access_log_entry

T = TypeVar("T")

_PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_ACCESS_LOG = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"


def _raw(data: bytes) -> bytes:
    return data


@dataclass(slots=True)
class StreamRecord:
    """What one stream did: the replies' bytes, how it ended (grpc's status code name),
    and whether the client reset it itself."""

    replies: list[bytes] = field(default_factory=list)
    status: str = "OK"
    details: str = ""
    cancelled: bool = False


def routed(replies: Sequence[bytes]) -> list[struct_pb2.Struct]:
    """The metadata the sidecar set for each request it routed (its `slogate` namespace:
    the in-flight id and whatever else Envoy copies into the request's access-log entry)."""
    found = []
    for data in replies:
        try:
            reply = pb.ProcessingResponse.FromString(data)
        except Exception:  # an unparseable reply is the properties' finding, not ours
            continue
        namespace = reply.dynamic_metadata.fields.get(METADATA_NAMESPACE)
        if namespace is None:
            continue
        value = namespace.struct_value.fields.get(TRACKING_ID_FIELD)
        if value is not None and value.string_value:
            found.append(namespace.struct_value)
    return found


def routed_ids(replies: Sequence[bytes]) -> list[str]:
    """The in-flight ids the sidecar sent back in its replies' dynamic metadata."""
    return [metadata.fields[TRACKING_ID_FIELD].string_value for metadata in routed(replies)]


class ErrorRecords(logging.Handler):
    """The sidecar's error records (an exception a servicer or a sink logged and went on
    from): each one is a finding."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f": {type(error).__name__}: {error}"
        self.records.append(f"{record.name}: {text}")


def _closed(tracking: str, decision: RoutingDecision) -> RequestOutcome:
    """What the servicer records for a decision whose stream closed before an answer
    (ExternalProcessorService._never_delivered): settled, no usage."""
    return outcome_from_stream(
        decision, tracking, 0, ResponseUsage(), None, 0.0, "", "ext_proc_stream_closed"
    )


class FuzzTarget:
    """A sidecar of `policy` in a thread; `stall_s`: how long a stream may take before it
    counts as stalled (a liveness bound, far above any answer's time)."""

    def __init__(self, policy: Path, stall_s: float = 60.0) -> None:
        self._policy = policy
        self.stall_s = stall_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz-sidecar")
        self._thread.daemon = True
        self.sidecar: Sidecar | None = None
        self._channel: grpc.Channel | None = None
        self.errors = ErrorRecords()

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout_s if timeout_s is not None else self.stall_s)

    def start(self) -> None:
        self._thread.start()

        async def started() -> tuple[Sidecar, int]:
            sidecar = Sidecar(self._policy, grpc_port=0, metrics_port=None, admin_address=None)
            address = await sidecar.start()
            return sidecar, address.grpc_port

        self.sidecar, port = self._run(started(), timeout_s=120)
        self._channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        logging.getLogger("slogate").addHandler(self.errors)

    def stop(self) -> None:
        logging.getLogger("slogate").removeHandler(self.errors)
        if self._channel is not None:
            self._channel.close()
        if self.sidecar is not None:
            self._run(self.sidecar.stop(grace_s=0.5))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _stub(self, method: str) -> Any:
        assert self._channel is not None, "start() first"
        kind = self._channel.stream_stream if method == _PROCESS else self._channel.stream_unary
        return kind(method, request_serializer=_raw, response_deserializer=_raw)

    def ext_proc(self, messages: Sequence[bytes], cancel_after: int | None = None) -> StreamRecord:
        """One ext_proc stream: `messages` sent as they are, then half-closed; the replies
        read to the end, or the stream reset after `cancel_after` replies (Envoy gone)."""
        record = StreamRecord()
        call = self._stub(_PROCESS)(iter(messages), timeout=self.stall_s)
        try:
            for reply in call:
                if cancel_after is not None and len(record.replies) >= cancel_after:
                    record.cancelled = True
                    call.cancel()
                    break
                record.replies.append(reply)
        except grpc.RpcError as error:
            record.status = error.code().name
            record.details = str(error.details())
        if record.cancelled:
            record.status = "CANCELLED"
        return record

    def access_log(self, messages: Sequence[bytes]) -> StreamRecord:
        """One access-log stream of `messages`, as they are."""
        record = StreamRecord()
        try:
            self._stub(_ACCESS_LOG)(iter(messages), timeout=self.stall_s)
        except grpc.RpcError as error:
            record.status = error.code().name
            record.details = str(error.details())
        return record

    def settle(self, requests: Sequence[struct_pb2.Struct]) -> None:
        """What Envoy's access log sends for requests that were routed and answered: each
        entry carries the metadata the sidecar set for its request, copied whole, as Envoy
        copies it (whatever proof the sidecar may ask of an entry travels with it)."""
        if not requests:
            return
        message = als_pb2.StreamAccessLogsMessage()
        message.identifier.log_name = ACCESS_LOG_NAME
        for metadata in requests:
            usage = {"prompt_tokens": 12, "completion_tokens": 3}
            entry = access_log_entry(None, 200, usage)
            entry.common_properties.metadata.filter_metadata[METADATA_NAMESPACE].CopyFrom(metadata)
            message.http_logs.log_entry.append(entry)
        record = self.access_log([message.SerializeToString()])
        if record.status != "OK":
            raise RuntimeError(f"settling failed: {record.status} {record.details}")

    def end_in_flight(self) -> None:
        """End every decision still in flight as a stream that closed before its answer
        ends it (what it holds given back), without waiting for the in-flight expiry:
        what one case left is not the next one's. Not as an expiry: that leaves the
        budget reservation to expire in its store, later."""
        self._run(self._end_in_flight())

    async def _end_in_flight(self) -> None:
        assert self.sidecar is not None
        recorder = self.sidecar.path.recorder
        # The table has no public listing (nothing else needs it).
        for tracking in list(self.sidecar.path.decider.inflight._entries):
            await finish(recorder.ended(tracking, functools.partial(_closed, tracking)))

    def held(self) -> dict[str, int]:
        """What the sidecar still holds: decisions in flight, KV tokens and batch slots,
        requests in the waiting room, engine holds, budget reservations."""
        return self._run(self._held())

    async def _held(self) -> dict[str, int]:
        sidecar = self.sidecar
        assert sidecar is not None
        path = sidecar.path
        kv = path.admission.kv
        tokens, slots = kv.book.held_by_pool()
        store = sidecar.stores.budgets
        keys = sidecar.policy().keys.values()
        reservations = sum([await store.outstanding(key.budget_id) for key in keys])
        return {
            "inflight": len(path.decider.inflight),
            "kv_tokens": sum(tokens.values()),
            "batch_slots": sum(slots.values()),
            "waiting": sum(kv.dispatcher.room.counts().values()),
            "engine_holds": sidecar.signals.engine_watch.fleet.holds,
            "reservations": reservations,
        }

    def drained(self, within_s: float = 10.0) -> dict[str, int]:
        """What is still held once nothing is left to settle, polled for `within_s` (a
        stream's end is settled in a task of its own): {} when nothing."""
        deadline = time.monotonic() + within_s
        while True:
            left = {name: n for name, n in self.held().items() if n}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.02)
