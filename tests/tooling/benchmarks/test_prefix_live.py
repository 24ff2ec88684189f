"""`slogate bench prefix-vllm` without its engines: the flags make the case, the arrivals are
the same every run, and a step's row is built from what the clients and vLLM's counters said."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tooling.benchmarks.prefix_report import summarize, table, write
from tooling.benchmarks.prefix_workload import Shape, arrivals, system_prompt
from tooling.cli.bench import prefix_shape
from tooling.cli.main import build_parser


def test_the_flags_make_the_case() -> None:
    flags = ["--customers", "4", "--prefix-tokens", "1536", "--rates", "0.5,1.5"]
    args = build_parser().parse_args(["bench", "prefix-vllm", *flags, "--kv-blocks", "32"])
    shape = prefix_shape(args)
    assert (shape.customers, shape.rates, shape.kv_blocks) == (4, (0.5, 1.5), 32)
    assert args.arms == ("round-robin", "approximate", "precise")
    # 4 x 1,536 tokens of shared prompts in 2 x 32 blocks of 128: 75% of the fleet's KV.
    assert shape.prefix_share() == 0.75


def test_arms_are_named_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "prefix-vllm", "--arms", "precise,round-robin"])
    assert args.arms == ("precise", "round-robin")
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "prefix-vllm", "--arms", "precise,random"])
    assert "unknown arm random; known: round-robin, approximate" in capsys.readouterr().err


def test_arrivals_are_seeded_and_stepped() -> None:
    shape = Shape(rates=(1.0, 4.0), step_s=30.0)
    plan = arrivals(shape)
    assert plan == arrivals(shape)
    assert plan != arrivals(Shape(rates=(1.0, 4.0), step_s=30.0, seed=1))
    first = [a for a in plan if a.step == 0]
    second = [a for a in plan if a.step == 1]
    assert all(a.at_s < 30 for a in first) and all(30 <= a.at_s < 60 for a in second)
    assert len(second) > 2 * len(first)  # four times the rate
    assert {a.customer for a in plan} == set(range(shape.customers))
    # Each arm's prompts differ from the first words on, the same length otherwise.
    one, two = system_prompt(shape, 0, 1), system_prompt(shape, 0, 2)
    assert one.split(":", 1)[1] == two.split(":", 1)[1] and one != two


def shot(step: int, end_s: float, ttft: float | None, status: int = 200) -> dict[str, object]:
    return {
        "step": step,
        "start_s": step * 10.0,
        "end_s": end_s,
        "status": status,
        "ttft_s": ttft,
        "output_tokens": 16,
        "prompt_tokens": 1000,
        "cached_tokens": 768,
        "error": "",
    }


def counters(hits: list[float], queries: list[float], done: list[float]) -> list[dict[str, float]]:
    return [
        {
            "vllm:prefix_cache_hits_total": h,
            "vllm:prefix_cache_queries_total": q,
            "vllm:request_success_total": d,
        }
        for h, q, d in zip(hits, queries, done, strict=True)
    ]


def test_a_step_row_from_the_shots_and_the_counters() -> None:
    shape = Shape(rates=(1.0, 2.0), step_s=10.0)
    shots = [
        shot(0, 5.0, 0.2),
        shot(0, 12.0, 0.4),  # sent in step 0, ended in step 1
        shot(0, 13.0, None, status=503),
        shot(1, 15.0, 1.0),
    ]
    # Two engines: their counters at the start and at each step's end.
    engine_a = counters([0, 600, 900], [1000, 2000, 3000], [5, 6, 7])
    engine_b = counters([0, 0, 300], [0, 1000, 1000], [0, 1, 2])
    rows = summarize(shape, shots, [engine_a, engine_b])
    first, second = rows
    assert (first["sent"], first["served"]) == (3, 2)
    assert first["completed_rps"] == 0.1 and second["completed_rps"] == 0.2
    assert first["output_tokens_per_s"] == 1.6
    assert first["ttft_mean_s"] == 0.3 and first["ttft_p90_s"] == 0.4
    assert first["vllm_hit_rate"] == 0.3  # 600 of 2,000
    assert second["vllm_hit_rate"] == 0.6  # 600 of 1,000
    assert first["cached_share"] == 0.768
    assert first["per_engine"] == [1, 1] and second["per_engine"] == [1, 1]
    report = {
        "arms": [
            {"arm": "precise", "steps": rows, "vllm_hit_rate": 0.45, "per_engine": [2, 2],
             "drain_s": 1.5, "load_average": 3.1}
        ]
    }  # fmt: skip
    text = table(report)
    assert "| precise | 0 (1.0) | 3 / 2 | 0.1 | 1.6 | 0.4 / 0.3 | 0.3 | 0.768 | 1 / 1 |" in text
    assert "| precise | 0.45 | 2 / 2 | 1.5 | 3.1 | - |" in text
    report["arms"][0]["kv_events"] = True
    report["arms"][0]["kv_index"] = {
        "slogate_kv_index_blocks{10.0.0.1:8000}": 40.0,
        "slogate_kv_index_events_total{10.0.0.1:8000,stored}": 300.0,
        "slogate_kv_index_events_total{10.0.0.1:8000,removed}": 260.0,
        "slogate_kv_index_blocks{10.0.0.2:8000}": 45.0,
    }
    assert "| 3.1 | 40 / 300 / 260; 45 / 0 / 0 |" in table(report)


def test_the_report_files(tmp_path: Path) -> None:
    shape = Shape(rates=(1.0,), step_s=10.0)
    rows = summarize(shape, [shot(0, 5.0, 0.2)], [counters([0, 500], [0, 1000], [0, 1])])
    arm = {"arm": "round robin", "steps": rows, "vllm_hit_rate": 0.5, "per_engine": [1],
           "drain_s": 0.0, "load_average": 1.0}  # fmt: skip
    report = {
        "when": "2026-12-05T07:00:00+00:00",
        "shape": {**asdict(shape), "prefix_share_of_kv": shape.prefix_share()},
        "requests_per_arm": 1,
        "arms": [arm],
    }
    write(tmp_path, report)
    assert json.loads((tmp_path / "prefix-vllm.json").read_text()) == json.loads(json.dumps(report))
    text = (tmp_path / "prefix-vllm.md").read_text()
    assert "12 customers with a 1,024-token shared prompt each (75% of the two engines' KV)" in text
    assert table(report) in text
