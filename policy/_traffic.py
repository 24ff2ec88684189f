"""The `traffic_record:` section: every decision's shape, recorded for replay.

What lives here: `TrafficRecordConfig` and its reader. The recorder itself is
extproc.service.traffic_record; the replay is sim.replay.
"""

from __future__ import annotations

from dataclasses import dataclass

from policy._reader import recorded_files


@dataclass(frozen=True, slots=True)
class TrafficRecordConfig:
    directory: str
    # Unlike the decision log's, 1.0 by default: a replay needs every request's arrival.
    sample_rate: float = 1.0
    keep_days: int = 7


def parse_traffic_record(raw: object, path: str) -> TrafficRecordConfig | None:
    files = recorded_files(raw, path, sample_rate=1.0)
    return None if files is None else TrafficRecordConfig(*files)
