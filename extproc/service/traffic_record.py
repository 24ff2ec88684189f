"""The traffic record: every decision's shape, cheap enough to keep on, for `slogate replay`.

What lives here: `TrafficRecorder` (a RequestObserver, extproc.service.observers: a record
per answered or expired request and per refusal). The event loop only builds a small dict
and puts it on the writing thread's bounded queue (extproc.service.record_files: full, the
record is dropped and counted, never waited for); the thread encodes, compresses and
writes. Files are `traffic-YYYY-MM-DD-<host>-<pid>.jsonl.gz`, one per process per UTC day
(`serve --workers` and replicas each write their own; the reader merges them), each flush a
gzip member of its own so that a crash leaves a readable prefix. Files older than
`keep_days` are deleted when the day turns. Never prompt text, never a key: the key's id
(a hash prefix) only.

The record's fields (version 1): `v`, `t` (arrival, Unix seconds), `id` (request id),
`key`, `tenant`, `tier`, `api`, `prompt` and `count` (how it was counted), `max_tokens`,
`n`, `stream`, `pool`, `bucket`, `outcome` (admitted, refused, expired), `reason`,
`status`, `usage_prompt`, `usage_completion`, `ttft_ms`, `duration_ms`, `waited_ms`,
`settled_ms` (arrival to the sidecar's settlement: when its budgets were freed),
`decided_ms` (arrival to the sidecar's decision: counting, and any wait for room). A
refusal before the request was counted has no shape (`prompt` null).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from admission.decision import RequestOutcome, RoutingDecision
from admission.errors import RequestRejected
from extproc.service.record_files import DropCounter, FileKind, RecordFiles
from policy._traffic import TrafficRecordConfig
from policy.domain import ApiKey

if TYPE_CHECKING:
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed
    from extproc.service.observers import RequestSeen


RECORD_VERSION = 1
TRAFFIC_FILES = FileKind(
    "traffic-", ".jsonl.gz", per_process=True, compressed=True, what="traffic record"
)


def shape_fields(decision: RoutingDecision) -> dict[str, Any]:
    """What a replay needs of a decision: who, what and how large; never text or keys.
    With a candidate policy loaded (shadow mode), what it would have done: `candidate`."""
    fields: dict[str, Any] = {
        "prompt": decision.prompt_tokens,
        "count": decision.estimate.value,
        "max_tokens": decision.max_tokens,
        "n": decision.sequences,
        "stream": decision.stream,
        "api": decision.api.name,
        "pool": decision.pool,
        "bucket": decision.bucket.name,
    }
    note = decision.candidate
    if note is not None and note.verdict:
        fields["candidate"] = {"verdict": note.verdict, "reason": note.reason, "pool": note.pool}
    return fields


def _caller_fields(caller: ApiKey | None) -> dict[str, Any]:
    if caller is None:
        return {"key": None, "tenant": None, "tier": None}
    return {"key": caller.key_id, "tenant": caller.tenant, "tier": caller.tier.value}


def outcome_record(
    outcome: RequestOutcome, arrived_s: float, decided_s: float, now_s: float
) -> dict[str, Any]:
    d = outcome.decision
    return {
        "v": RECORD_VERSION,
        "t": round(arrived_s, 4),
        "id": d.request_id,
        **_caller_fields(d.caller),
        **shape_fields(d),
        "outcome": "expired" if outcome.expired else "admitted",
        "reason": None,
        "status": outcome.status,
        "usage_prompt": outcome.prompt_tokens,
        "usage_completion": outcome.completion_tokens,
        "ttft_ms": None if outcome.ttft_s is None else round(outcome.ttft_s * 1000, 1),
        "duration_ms": round(outcome.duration_s * 1000, 1),
        "waited_ms": round(d.waited_s * 1000, 1),
        # When the sidecar settled it (its budgets and KV hold freed): Envoy batches its
        # access-log entries, so this comes a little after the duration's end.
        "settled_ms": round((now_s - arrived_s) * 1000, 1),
        "decided_ms": round((decided_s - arrived_s) * 1000, 1),
    }


def refusal_record(
    error: RequestRejected,
    request_id: str,
    caller: ApiKey | None,
    shape: RoutingDecision | None,
    arrived_s: float,
    now_s: float,
) -> dict[str, Any]:
    fields = shape_fields(shape) if shape is not None else {"prompt": None}
    return {
        "decided_ms": round((now_s - arrived_s) * 1000, 1),
        "v": RECORD_VERSION,
        "t": round(arrived_s, 4),
        "id": request_id,
        **_caller_fields(caller),
        **fields,
        "outcome": "refused",
        "reason": error.reason,
        "status": error.status,
    }


class TrafficRecorder:
    """What the event loop calls: cheap, never blocking, never raising."""

    def __init__(
        self,
        files: RecordFiles,
        sample_rate: float,
        dropped: DropCounter,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.files = files
        self.sample_rate = sample_rate
        self._dropped = dropped
        self._clock = clock
        self._rng = rng or random.Random()
        # Arrival times of routed requests until their outcome comes (popped then, or at
        # expiry: InFlight hands every routed request to the sinks once).
        self._arrived: dict[str, tuple[float, float]] = {}  # (arrived, decided)

    @classmethod
    def from_config(
        cls, config: TrafficRecordConfig, dropped: DropCounter, policy_dir: Path
    ) -> TrafficRecorder:
        """`dir` as written: relative to the policy file's folder."""
        return cls(
            RecordFiles(policy_dir / config.directory, TRAFFIC_FILES, config.keep_days),
            config.sample_rate,
            dropped,
        )

    def _sampled(self) -> bool:
        return self.sample_rate >= 1.0 or self._rng.random() < self.sample_rate

    def _put(self, record: dict[str, Any]) -> None:
        if not self.files.put(record):
            self._dropped.inc()

    def arrived(self, request: RequestSeen, headers: Mapping[str, str]) -> None:
        pass

    def routed(self, request: RequestSeen, routed: Routed, reply: pb.ProcessingResponse) -> None:
        self.admitted(routed.tracking_id, request.arrived_s)

    def admitted(self, tracking_id: str, arrived_s: float) -> None:
        """A routed request's arrival and decision, kept until its outcome is recorded."""
        self._arrived[tracking_id] = (arrived_s, self._clock())

    def abandoned(self, request: RequestSeen) -> None:
        pass

    def record(self, outcome: RequestOutcome) -> None:
        """A routed request, once its access-log entry (or expiry) came."""
        now_s = self._clock()
        arrived_s, decided_s = self._arrived.pop(outcome.tracking_id, (0.0, 0.0))
        if not arrived_s:
            arrived_s = decided_s = now_s - outcome.duration_s
        if self._sampled():
            self._put(outcome_record(outcome, arrived_s, decided_s, now_s))

    def refused(self, request: RequestSeen, error: RequestRejected) -> None:
        if self._sampled():
            now_s = self._clock()
            caller, shape, arrived_s = request.caller, request.shape, request.arrived_s
            self._put(refusal_record(error, request.request_id, caller, shape, arrived_s, now_s))

    def close(self) -> None:
        self.files.close()
