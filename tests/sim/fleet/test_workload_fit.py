"""`slogate workload fit`: a workload fitted to a traffic record reproduces the recorded
per-tenant rate (and its daily shape, and its burst) and length distributions within 10%,
drawn by the simulator's own arrival machinery (sim.fleet.workload_files.workload_from)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import yaml

from extproc.service.traffic_read import TrafficEntry, read_traffic
from sim.fleet.workload_files import (
    SIMULATION_POLICY,
    WORKLOADS,
    Workload,
    load_workload,
    workload_path,
)
from sim.fleet.workload_fit import fit_workload
from tooling.cli.main import main

DAY0 = dt.datetime(2026, 9, 1, tzinfo=dt.UTC).timestamp()
DAY_S = 86_400.0
BURST = (14 * 3600.0, 14.5 * 3600.0)  # search's burst: 10x for half an hour
# tenant: tier, mean rate, daily shape, prompt and output draws, streamed share
TENANTS: dict[str, dict[str, Any]] = {
    "support": {
        "tier": "critical",
        "rate": 0.2,
        "shape": lambda h: 1 + 0.6 * math.sin(2 * math.pi * (h - 8) / 24),  # day-heavy
        "prompt": lambda g: g.lognormal(math.log(1500), 0.6),
        "output": lambda g: g.lognormal(math.log(200), 0.5),
        "stream": 0.3,
    },
    "search": {
        "tier": "standard",
        "rate": 0.1,
        "shape": lambda h: 1.0,
        "prompt": lambda g: g.uniform(500, 3000),
        "output": lambda g: g.uniform(50, 400),
        "stream": 0.8,
    },
    "reports": {
        "tier": "sheddable",
        "rate": 0.05,
        "shape": lambda h: 1 + 0.8 * math.cos(2 * math.pi * h / 24),  # night-heavy
        "prompt": lambda g: g.lognormal(math.log(8000), 0.4),
        "output": lambda g: g.lognormal(math.log(600), 0.3),
        "stream": 0.1,
    },
}


def _record(directory: Path, days: int = 1, seed: int = 3) -> int:
    """A synthetic record: `days` days of the tenants above, in two processes' files."""
    g = np.random.default_rng(seed)
    lines: list[dict[str, Any]] = []
    for tenant, spec in TENANTS.items():
        # Thinning against the peak of the shape (and search's burst).
        peak = spec["rate"] * (10.0 if tenant == "search" else 1.8)
        t = 0.0
        while True:
            t += float(g.exponential(1.0 / peak))
            if t >= days * DAY_S:
                break
            second = t % DAY_S
            rate = spec["rate"] * spec["shape"](second / 3600.0)
            if tenant == "search" and t < DAY_S and BURST[0] <= second < BURST[1]:
                rate *= 10.0
            if g.random() * peak > rate:
                continue
            lines.append(
                {
                    "v": 1,
                    "t": DAY0 + t,
                    "id": f"r{len(lines)}",
                    "outcome": "admitted",
                    "tenant": tenant,
                    "tier": spec["tier"],
                    "prompt": int(spec["prompt"](g)),
                    "usage_prompt": None,
                    "usage_completion": max(1, int(spec["output"](g))),
                    "max_tokens": 1024,
                    "stream": bool(g.random() < spec["stream"]),
                    "status": 200,
                }
            )
    lines.sort(key=lambda line: line["t"])
    for process in (1, 2):  # two workers' files, read together
        body = "".join(json.dumps(x) + "\n" for x in lines[process - 1 :: 2]).encode()
        (directory / f"traffic-2026-09-01-host-{process}.jsonl.gz").write_bytes(gzip.compress(body))
    return len(lines)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], dict[str, Any], Path]:
    """A day's record fitted in 15-minute bins: the entries, the document, its file."""
    tmp = tmp_path_factory.mktemp("fit")
    records = tmp / "record"
    records.mkdir()
    _record(records)
    out = tmp / "fitted.yaml"
    code = main(
        [
            "workload", "fit", "--traffic", str(records), "--from", str(DAY0),
            "--to", str(DAY0 + DAY_S), "--bin-s", "900", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    return read_traffic([records]).entries, yaml.safe_load(out.read_text()), out


@pytest.fixture(scope="module")
def drawn_workload(fitted: tuple[list[Any], dict[str, Any], Path]) -> Workload:
    """The fitted file drawn as the simulator draws a workload."""
    return load_workload(fitted[2], SIMULATION_POLICY, seed=5)


def _close(drawn: float, recorded: float, within: float = 0.10) -> bool:
    return abs(drawn - recorded) <= within * abs(recorded)


def test_a_fitted_workload_reproduces_the_record_within_10_percent(
    fitted: tuple[list[Any], dict[str, Any], Path], drawn_workload: Workload
) -> None:
    entries, document, _ = fitted
    workload = drawn_workload
    assert workload.duration_s == DAY_S
    for tenant, spec in TENANTS.items():
        recorded = [e for e in entries if e.tenant == tenant]
        drawn = [a for a in workload.arrivals if a.key.tenant == tenant]
        assert drawn[0].key.tier.value == spec["tier"]
        assert _close(len(drawn), len(recorded)), (tenant, len(drawn), len(recorded))
        # The daily shape: each quarter of the day's rate.
        for quarter in range(4):
            low, high = quarter * DAY_S / 4, (quarter + 1) * DAY_S / 4
            real = sum(low <= e.t - DAY0 < high for e in recorded)
            played = sum(low <= a.at_s < high for a in drawn)
            assert _close(played, real), (tenant, quarter, played, real)
        for q in (0.5, 0.9):
            real_prompt = np.quantile([e.prompt for e in recorded], q)
            real_output = np.quantile([e.usage_completion for e in recorded], q)
            assert _close(float(np.quantile([a.prompt_tokens for a in drawn], q)), real_prompt)
            assert _close(float(np.quantile([a.output_tokens for a in drawn], q)), real_output)
        real_share = sum(e.stream for e in recorded) / len(recorded)
        assert _close(sum(a.stream for a in drawn) / len(drawn), real_share), tenant
    # The burst: search's half hour at 10x, found at k = 3 and played at its height.
    (search,) = [t for t in document["tenants"] if t["tenant"] == "search"]
    assert [t["tenant"] for t in document["tenants"] if "bursts" in t] == ["search"]
    assert document["burst_tenants"] == ["search"]
    ((start_s, end_s),) = document["bursts"]
    assert (start_s, end_s) == BURST
    assert search["bursts"][0]["factor"] > 8
    real = sum(start_s <= e.t - DAY0 < end_s for e in entries if e.tenant == "search")
    played = sum(start_s <= a.at_s < end_s for a in workload.arrivals if a.key.tenant == "search")
    assert _close(played, real), (played, real)


def test_scale_multiplies_every_tenants_rate() -> None:
    path = WORKLOADS / "field-mix.yaml"
    once = load_workload(path, SIMULATION_POLICY, seed=5)
    twice = load_workload(path, SIMULATION_POLICY, seed=5, scale=2)
    for tenant in ("support", "product", "reports"):
        n1 = sum(a.key.tenant == tenant for a in once.arrivals)
        n2 = sum(a.key.tenant == tenant for a in twice.arrivals)
        assert _close(n2, 2 * n1), (tenant, n1, n2)


def test_a_workload_is_named_or_a_file() -> None:
    assert workload_path("burst-10x") == WORKLOADS / "burst-10x.yaml"
    assert workload_path("fitted.yaml") == Path("fitted.yaml")
    assert workload_path("out/fitted") == Path("out/fitted")


def test_a_record_of_several_days_is_folded_onto_one(tmp_path: Path) -> None:
    _record(tmp_path, days=2)
    entries = read_traffic([tmp_path]).entries
    document = fit_workload(entries, DAY0, DAY0 + 2 * DAY_S, bin_s=3600)
    assert document["duration_s"] == DAY_S and document["fitted"]["folded_days"] == 2
    for tenant in document["tenants"]:
        recorded = sum(e.tenant == tenant["tenant"] for e in entries)
        assert _close(tenant["streams"][0]["rate_per_s"] * 2 * DAY_S, recorded, 0.001)
        assert len(tenant["streams"][0]["shape"]) == 2 * 24
    # Search's burst happened on the first day only: its window keeps its date.
    (search,) = [t for t in document["tenants"] if t["tenant"] == "search"]
    assert search["bursts"][0]["from"] == "2026-09-01T14:00:00+00:00"


def test_fit_refuses_a_record_without_tenants(tmp_path: Path) -> None:
    (tmp_path / "traffic-2026-09-01-h-1.jsonl.gz").write_bytes(
        gzip.compress(b'{"v": 1, "t": 1.0, "outcome": "refused", "reason": "unknown_key"}\n')
    )
    assert (
        main(["workload", "fit", "--traffic", str(tmp_path), "--out", str(tmp_path / "w.yaml")])
        == 2
    )


def test_simulate_plays_a_workload_file_at_a_scale(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    stream = {"rate_per_s": 1.0, "prompt_tokens": [100, 200, 400], "max_tokens": 64}
    stream["output_tokens"] = [10, 20, 40]
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "duration_s": 20,
                "tenants": [{"tenant": "a", "tier": "critical", "streams": [stream]}],
            }
        )
    )
    out = tmp_path / "out"
    argv = ["simulate", "--workload", str(path), "--scale", "2", "--out-dir", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "simulate-tiny-x2.json").read_text())
    played = report["dynamic"]["tiers"]["critical"]["requests"]
    assert played == len(load_workload(path, SIMULATION_POLICY, scale=2).arrivals) > 30


def test_no_bin_is_a_sliver_that_turns_one_request_into_a_spike() -> None:
    entries = [
        TrafficEntry(v=1, t=DAY0 + i, outcome="admitted", tenant="a", tier="standard", prompt=10)
        for i in range(1000)
    ]
    entries.append(msgspec.structs.replace(entries[-1], t=DAY0 + 1000.01))
    for end_s in (None, DAY0 + 1000.02):  # rounded up to a whole bin; the remainder joined
        document = fit_workload(entries, DAY0, end_s, bin_s=100)
        shape = document["tenants"][0]["streams"][0]["shape"]
        assert max(f for _, f in shape) < 1.2, (end_s, shape[-2:])
