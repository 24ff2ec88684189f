"""bench stages: stages from file paths, C time given to its callers, and the in-process
request path run for real (the sidecar's servicers, Envoy's messages) on a few requests."""

from __future__ import annotations

import cProfile
from pathlib import Path

from tooling.benchmarks import request_path
from tooling.benchmarks.stage_map import HARNESS, OTHER, shares, stage_of


def test_a_function_belongs_to_the_first_stage_its_file_names() -> None:
    assert stage_of("/x/extproc/request/tokens/prompt.py") == "prompt counting"
    assert stage_of("/x/extproc/service/metrics.py") == "metrics"
    assert stage_of("/x/admission/kv/step.py") == "KV admission and waiting room"
    assert stage_of("/x/admission/chain.py") == "admission chain, access, decision"
    assert stage_of("/x/lib/python3.11/asyncio/events.py").startswith("event loop")
    assert stage_of("/x/tooling/benchmarks/request_path.py") == HARNESS
    assert stage_of("/x/somewhere/else.py") == OTHER
    assert HARNESS not in shares({HARNESS: 5.0, OTHER: 1.0, "metrics": 3.0})
    assert shares({HARNESS: 5.0, OTHER: 1.0, "metrics": 3.0})["metrics"] == 0.75


def _sorts(values: list[int]) -> list[int]:
    return sorted(values)  # a built-in: its time belongs to this file's stage


def test_a_built_ins_time_goes_to_the_stage_of_its_caller(tmp_path: Path) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        _sorts(list(range(2000, 0, -1)))
    profiler.disable()
    dump = tmp_path / "p.prof"
    profiler.dump_stats(str(dump))

    def stage(path: str) -> str:
        return "caller" if path.endswith("test_stages.py") else OTHER

    own = request_path.own_time(dump, stage)
    assert own["caller"] > 0
    # sorted() is C: without the rule it would be "~", other; with it, nearly all is ours.
    assert own["caller"] > 5 * own.get(OTHER, 0.0)


def test_the_request_path_in_process_admits_each_request_and_times_it(tmp_path: Path) -> None:
    dump = tmp_path / "request_path.prof"
    phases = request_path.measure("small", 30, profiled=dump)
    assert set(phases) == set(request_path.PHASES)
    for phase in request_path.PHASES:
        assert phases[phase]["mean_us"] > 0, phase
    assert dump.stat().st_size > 0


def test_the_request_path_in_process_with_one_message_times_the_body_alone() -> None:
    # Envoy's body message alone, its headers forwarded as metadata: every request admitted
    # (a refusal raises), its header phase inside the body's.
    phases = request_path.measure("small", 30, one_message=True)
    assert phases["request_headers"]["mean_us"] == 0
    assert phases["request_body"]["mean_us"] > 0
    assert phases["access_log"]["mean_us"] > 0
