"""What `slogate bench workers` scales with N, and the ceiling it reads a run against
(tooling/benchmarks/workers.py); the bench itself runs on a machine with the cores for it."""

from __future__ import annotations

from tooling.benchmarks.workers import PARTS, ceiling_rps, envoy_threads, wrk_load


def test_the_load_grows_with_the_workers() -> None:
    assert [wrk_load(n) for n in (1, 2, 4, 8)] == [(16, 2), (32, 2), (64, 2), (128, 4)]
    assert [envoy_threads(n) for n in (1, 2, 4, 8)] == [4, 4, 8, 16]


def test_the_ceiling_is_the_cores_or_the_workers_whichever_binds() -> None:
    row = {f"cpu_us_per_request_{p}": 0.0 for p in PARTS}
    row.update(cpu_us_per_request_sidecar=2000.0, cpu_us_per_request_envoy=500.0)
    row["cpu_us_per_request_redis"] = 500.0  # 3,000 µs of CPU a request in all
    assert ceiling_rps(1, row, cpus=2) == 500.0  # one worker: its core, 1e6 / 2,000
    assert round(ceiling_rps(2, row, cpus=2)) == 667  # two: the machine's 2 cores / 3,000
    assert ceiling_rps(8, row, cpus=16) == 4000.0  # eight workers on 16 cores: the workers
