"""A sampled log of decisions for incident review: JSON lines, one file per UTC day.

What lives here: `DecisionLog`, a RequestObserver (extproc.service.observers): a line per
answered request (routed, with usage and latency, or expired), per refusal, and per move
of the quotas ahead of a ramp (`quota_ahead`: whose, why, before and after). Each line:
time, request id, key id (never the key), tenant, tier, bucket, prompt estimate and how it
was counted, decision, pool, status, usage, TTFT, duration, whether its spend budget was
checked (a refusal names its reason: `spend_unverified` when the spend store did not
answer in time). No prompt text, ever. Files are `decisions-YYYY-MM-DD.jsonl` (shared by
`serve --workers`' processes: each batch is appended whole); files older than `keep_days`
are deleted when the day turns. The event loop only builds the line's dict and puts it on
the writing thread's bounded queue (extproc.service.record_files): a slow disk never holds
a request; a full queue drops the line and counts it (slogate_decision_log_dropped_total).
The clock is injected.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from admission.decision import RequestOutcome
from admission.errors import RequestRejected
from extproc.service.record_files import DropCounter, FileKind, RecordFiles
from policy.schema import DecisionLogConfig

if TYPE_CHECKING:
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed
    from extproc.service.observers import RequestSeen

DECISION_FILES = FileKind(
    "decisions-", ".jsonl", per_process=False, compressed=False, what="decision log"
)


class DecisionLog:
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

    @classmethod
    def from_config(cls, config: DecisionLogConfig, dropped: DropCounter) -> DecisionLog:
        return cls(
            RecordFiles(Path(config.directory), DECISION_FILES, config.keep_days),
            config.sample_rate,
            dropped,
        )

    def _sampled(self) -> bool:
        return self.sample_rate >= 1.0 or self._rng.random() < self.sample_rate

    def _write(self, record: dict[str, Any]) -> None:
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        record["time"] = now.isoformat(timespec="milliseconds")
        if not self.files.put(record):
            self._dropped.inc()

    def arrived(self, request: RequestSeen, headers: Mapping[str, str]) -> None:
        pass

    def routed(self, request: RequestSeen, routed: Routed, reply: pb.ProcessingResponse) -> None:
        pass  # written when it is answered, with its usage

    def abandoned(self, request: RequestSeen) -> None:
        pass

    def record(self, outcome: RequestOutcome) -> None:
        """A routed request, once its access-log entry (or expiry) came."""
        if not self._sampled():
            return
        d = outcome.decision
        self._write(
            {
                "request_id": d.request_id,
                "key_id": d.caller.key_id,
                "tenant": d.caller.tenant,
                "tier": d.caller.tier.value,
                "bucket": d.bucket.name,
                "prompt_tokens_est": d.prompt_tokens,
                "estimate": d.estimate.value,
                "max_tokens": d.max_tokens,
                "decision": "expired" if outcome.expired else "routed",
                "pool": d.pool,
                "status": outcome.status,
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "ttft_ms": None if outcome.ttft_s is None else round(outcome.ttft_s * 1000, 1),
                "duration_ms": round(outcome.duration_s * 1000, 1),
                "waited_ms": round(d.waited_s * 1000, 1),  # in the waiting room
                # Its tenant's spend budget: checked, unverified (the store did not answer
                # in time; admitted by `budget.spend_unverified: admit`), or none.
                "spend": None
                if d.spend is None
                else ("checked" if d.spend.verified else "unverified"),
            }
        )

    def refused(self, request: RequestSeen, error: RequestRejected) -> None:
        if not self._sampled():
            return
        caller = request.caller
        self._write(
            {
                "request_id": request.request_id,
                "tenant": caller.tenant if caller is not None else None,
                "decision": "refused",
                "reason": error.reason,
                "status": error.status,
            }
        )

    def quota_moved(self, what: str, reason: str, before: float, after: float) -> None:
        """A move of the quotas ahead of a ramp (budget.ahead), each one written (a few a
        day): `what` names the tenant (or the tier lent to), `reason` says why."""
        self._write(
            {
                "decision": "quota_ahead",
                "tenant": what.split(":", 1)[1] if ":" in what else what,
                "reason": reason,
                "before": before,
                "after": after,
            }
        )

    def close(self) -> None:
        """Write what is queued, then stop the writing thread."""
        self.files.close()
