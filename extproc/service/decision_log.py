"""A sampled log of decisions for incident review: JSON lines, one file per UTC day.

What lives here: `DecisionLog`, a RequestObserver (extproc.service.observers): a line per
answered request (routed, with usage and latency, or expired) and per refusal. Each line:
time, request id, key id (never the key), tenant, tier, bucket, prompt estimate and how it
was counted, decision, pool, status, usage, TTFT, duration, whether its spend budget was
checked (a refusal names its reason: `spend_unverified` when the spend store did not
answer in time). No prompt text, ever. Files are
`decisions-YYYY-MM-DD.jsonl`; files older than `keep_days` are deleted when the day turns.
The clock is injected.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec

from admission.decision import RequestOutcome
from admission.errors import RequestRejected

if TYPE_CHECKING:
    from extproc.envoypb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from extproc.request.verdicts import Routed
    from extproc.service.observers import RequestSeen

log = logging.getLogger("slogate.decisions")
_PREFIX = "decisions-"


class DecisionLog:
    def __init__(
        self,
        directory: Path,
        sample_rate: float,
        keep_days: int = 7,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        import time

        self.directory = directory
        self.sample_rate = sample_rate
        self.keep_days = keep_days
        self._clock = clock or time.time
        self._rng = rng or random.Random()
        self._day: str | None = None
        self._file: IO[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def _sampled(self) -> bool:
        return self.sample_rate >= 1.0 or self._rng.random() < self.sample_rate

    def _write(self, record: dict[str, Any]) -> None:
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        day = now.strftime("%Y-%m-%d")
        if day != self._day:
            self._rotate(day, now)
        record["time"] = now.isoformat(timespec="milliseconds")
        assert self._file is not None
        self._file.write(msgspec.json.encode(record) + b"\n")
        self._file.flush()

    def _rotate(self, day: str, now: dt.datetime) -> None:
        if self._file is not None:
            self._file.close()
        self._day = day
        self._file = (self.directory / f"{_PREFIX}{day}.jsonl").open("ab")
        oldest = (now - dt.timedelta(days=self.keep_days)).strftime("%Y-%m-%d")
        for path in self.directory.glob(f"{_PREFIX}*.jsonl"):
            if path.stem.removeprefix(_PREFIX) <= oldest:
                path.unlink(missing_ok=True)
                log.info("decision log %s deleted (older than %d days)", path, self.keep_days)

    def arrived(self, request: RequestSeen, headers: Mapping[str, str]) -> None:
        pass

    def routed(self, request: RequestSeen, routed: Routed, reply: pb.ProcessingResponse) -> None:
        pass  # written when it is answered, with its usage

    def abandoned(self, request: RequestSeen) -> None:
        pass

    async def record(self, outcome: RequestOutcome) -> None:
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

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
