"""Records written to files by a thread, never by the event loop: one file per UTC day.

What lives here: `RecordFiles`, the writing thread both the traffic record
(extproc.service.traffic_record) and the decision log (extproc.service.decision_log) put
their records on, and `FileKind`, how each names and encodes its files. The loop only
puts a small dict on a bounded queue (full: the record is dropped and the caller counts
it, never waited for); the thread encodes, writes and, when the UTC day turns, deletes the
files older than `keep_days`. A disk that stalls (a full volume, a slow network mount)
stalls the thread, never a request.

Each batch is written with one `write` on a file opened for appending, so several
processes (`serve --workers`) may share one file name and their lines never interleave
mid-line; a kind that compresses writes each batch as a gzip member of its own, so a crash
leaves a readable prefix.
"""

from __future__ import annotations

import datetime as dt
import gzip
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("slogate.records")

QUEUE_RECORDS = 65_536  # about 20 s of a busy sidecar's records; more waiting: dropped
FLUSH_INTERVAL_S = 1.0
_BATCH = 4096
_STOP: dict[str, Any] = {}


class DropCounter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


@dataclass(frozen=True, slots=True)
class FileKind:
    """How one kind of record is filed: `<prefix>YYYY-MM-DD[-<host>-<pid>]<suffix>`."""

    prefix: str
    suffix: str
    per_process: bool  # a file per process (its own name) or one shared by appending
    compressed: bool  # each batch a gzip member
    what: str  # for the thread's name and the log

    def day_of(self, path: Path) -> str | None:
        """The UTC day in a file's name, or None for a file that is not one of this kind."""
        name = path.name
        if not (name.startswith(self.prefix) and name.endswith(self.suffix)):
            return None
        return name[len(self.prefix) : len(self.prefix) + 10]


class RecordFiles:
    """The writing thread: records put on `queue` land in the day's file within a flush."""

    def __init__(
        self,
        directory: Path,
        kind: FileKind,
        keep_days: int,
        clock: Callable[[], float] = time.time,
        max_queue: int = QUEUE_RECORDS,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.directory = directory
        self.kind = kind
        self.keep_days = keep_days
        self._clock = clock
        self._flush_interval_s = flush_interval_s
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(max_queue)
        self._process = f"-{socket.gethostname()}-{os.getpid()}" if kind.per_process else ""
        self._day: str | None = None
        self._encoder = msgspec.json.Encoder()
        directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"slogate-{kind.what}", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> bool:
        """From the event loop: False when the queue is full (the record is dropped)."""
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            return False
        return True

    def path_for(self, day: str) -> Path:
        return self.directory / f"{self.kind.prefix}{day}{self._process}{self.kind.suffix}"

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[dict[str, Any]] = []
            try:
                batch.append(self.queue.get(timeout=self._flush_interval_s))
                while len(batch) < _BATCH:
                    batch.append(self.queue.get_nowait())
            except queue.Empty:
                pass
            if batch and batch[-1] is _STOP:
                stopping = True
                batch.pop()
            try:
                self._write(batch)
            except OSError:
                log.exception("%s: could not write %d records", self.kind.what, len(batch))

    def _write(self, batch: list[dict[str, Any]]) -> None:
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        day = now.strftime("%Y-%m-%d")
        if day != self._day:
            self._day = day
            self.delete_old(now)
        if not batch:
            return
        data = b"".join(self._encoder.encode(record) + b"\n" for record in batch)
        if self.kind.compressed:
            data = gzip.compress(data, compresslevel=6, mtime=0)
        # Unbuffered: the batch is one write(2), whole, even beside other processes.
        with self.path_for(day).open("ab", buffering=0) as file:
            file.write(data)

    def delete_old(self, now: dt.datetime) -> None:
        oldest_kept = (now - dt.timedelta(days=self.keep_days - 1)).strftime("%Y-%m-%d")
        for path in self.directory.glob(f"{self.kind.prefix}*{self.kind.suffix}"):
            day = self.kind.day_of(path)
            if day is not None and day < oldest_kept:
                path.unlink(missing_ok=True)
                log.info("%s %s deleted (older than %d days)", self.kind.what, path, self.keep_days)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread.is_alive():
            self.queue.put(_STOP)
            self._thread.join(timeout_s)


def dropped_counter(registry: CollectorRegistry, kind: FileKind) -> Counter:
    """slogate_<what>_dropped_total (traffic_record, decision_log), in the sidecar's registry."""
    return Counter(
        f"slogate_{kind.what.replace(' ', '_')}_dropped_total",
        f"{kind.what.capitalize()} lines dropped because the writer's queue was full.",
        registry=registry,
    )
