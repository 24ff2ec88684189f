"""Writers for the records the loop hands to a thread (extproc.service.record_files):
a drop counter to read back and a writer whose disk hangs until released."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from extproc.service.record_files import FileKind, RecordFiles


class Drops:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, amount: float = 1) -> None:
        self.count += int(amount)


class StuckFiles(RecordFiles):
    """A writer whose disk hangs: the loop must not notice."""

    def __init__(self, directory: Path, kind: FileKind) -> None:
        self.release = threading.Event()
        self.writing = threading.Event()
        super().__init__(directory, kind, keep_days=7, max_queue=2, flush_interval_s=0.01)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        if batch:
            self.writing.set()
            self.release.wait(10)
        super()._write(batch)
