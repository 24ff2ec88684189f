"""Reading traffic records (extproc.service.traffic_record) back: every file of a directory,
merged by arrival time, each line checked.

What lives here: `TrafficEntry` (one record), `read_traffic` (files -> entries and the
problems found, as `file:line: what is wrong`) and `parse_time` (for --from / --to). A
bad line is reported and skipped; a file whose compressed data breaks off (a crash in the
middle of a write, a truncated copy) gives its readable prefix and one problem naming the
line where it broke. Nothing here writes. It lives beside the writer, below the runtime, so
that the sidecar's forecast refit (extproc.runtime.forecast_refit), the simulator's replay and
the tools all read the record the one way.
"""

from __future__ import annotations

import datetime as dt
import gzip
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from extproc.service.traffic_record import RECORD_VERSION, TRAFFIC_FILES

OUTCOMES = frozenset({"admitted", "refused", "expired"})


class CandidateVerdict(msgspec.Struct, frozen=True):
    """What the candidate policy (shadow mode) would have done; `reason`: its refusal."""

    verdict: str
    reason: str = ""
    pool: str = ""


class TrafficEntry(msgspec.Struct, frozen=True):
    v: int
    t: float
    outcome: str
    id: str = ""
    key: str | None = None
    tenant: str | None = None
    tier: str | None = None
    api: str | None = None
    prompt: int | None = None
    count: str | None = None
    max_tokens: int = 0
    n: int = 1
    stream: bool = False
    pool: str | None = None
    bucket: str | None = None
    reason: str | None = None
    status: int = 0
    usage_prompt: int | None = None
    usage_completion: int | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    waited_ms: float | None = None
    settled_ms: float | None = None
    decided_ms: float | None = None
    candidate: CandidateVerdict | None = None  # only with a candidate policy loaded

    @property
    def admitted(self) -> bool:
        """Admitted by slogate (what became of it upstream is the engine's part)."""
        return self.outcome != "refused"

    @property
    def verdict(self) -> str:
        """`admitted`, or `refused:<reason>`: what a replay must reproduce."""
        return "admitted" if self.admitted else f"refused:{self.reason}"


@dataclass(slots=True)
class TrafficRead:
    entries: list[TrafficEntry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "file:line: what is wrong"
    files: list[Path] = field(default_factory=list)


_DECODER = msgspec.json.Decoder(TrafficEntry)


def record_files(paths: Iterable[Path]) -> list[Path]:
    """The record files named, directories expanded to the record files in them."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob(f"{TRAFFIC_FILES.prefix}*{TRAFFIC_FILES.suffix}"))
        else:
            found.append(path)
    return found


def check(entry: TrafficEntry) -> str | None:
    """What is wrong with a decoded record, or None."""
    if entry.v != RECORD_VERSION:
        return f"record version {entry.v}; this slogate reads version {RECORD_VERSION}"
    if entry.outcome not in OUTCOMES:
        return f"outcome {entry.outcome!r} is not one of {', '.join(sorted(OUTCOMES))}"
    if entry.outcome == "refused" and not entry.reason:
        return "a refusal without its reason"
    if entry.prompt is not None and entry.prompt < 0:
        return f"prompt {entry.prompt} is negative"
    return None


def _lines(path: Path) -> Iterator[bytes]:
    with gzip.open(path, "rb") as file:
        yield from file


def read_file(path: Path, into: TrafficRead) -> None:
    line = 0
    try:
        for line, raw in enumerate(_lines(path), start=1):
            if not raw.endswith(b"\n"):
                into.problems.append(f"{path}:{line}: truncated line (no end)")
                continue
            try:
                entry = _DECODER.decode(raw)
            except msgspec.DecodeError as error:
                into.problems.append(f"{path}:{line}: {error}")
                continue
            wrong = check(entry)
            if wrong is not None:
                into.problems.append(f"{path}:{line}: {wrong}")
                continue
            into.entries.append(entry)
    except (EOFError, OSError, zlib.error) as error:
        into.problems.append(
            f"{path}:{line + 1}: compressed data broken off or corrupt ({error}); "
            f"lines 1-{line} read, the rest of this file skipped"
        )


def read_traffic(
    paths: Iterable[Path], from_s: float | None = None, to_s: float | None = None
) -> TrafficRead:
    """Every record in `paths` (files, or directories of them), by arrival time."""
    read = TrafficRead()
    for path in record_files(paths):
        read.files.append(path)
        read_file(path, read)
    if from_s is not None or to_s is not None:
        low = -float("inf") if from_s is None else from_s
        high = float("inf") if to_s is None else to_s
        read.entries = [e for e in read.entries if low <= e.t < high]
    read.entries.sort(key=lambda e: e.t)  # stable: a file's own order breaks ties
    return read


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()
