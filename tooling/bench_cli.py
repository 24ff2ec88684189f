"""The arguments of the offline commands, `slogate simulate`, `slogate calibrate` and the
`slogate bench` benchmarks; their handlers are tooling.offline_commands'."""

from __future__ import annotations

import argparse
from pathlib import Path

from tooling.cli_common import policy_arg


def add_simulate_command(sub: argparse._SubParsersAction) -> None:
    simulate = sub.add_parser(
        "simulate", help="offline fleet: best static quota (sweep) vs the dynamic controller"
    )
    simulate.add_argument(
        "--workload",
        default="burst-10x",
        help="a name in sim/workloads/, or a workload file (e.g. slogate workload fit's)",
    )
    simulate.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every tenant's arrival rate (e.g. 2: the quarterly 2x test)",
    )
    simulate.add_argument("--seed", type=int, default=7)
    simulate.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    simulate.add_argument(
        "--latency-from",
        type=Path,
        default=None,
        help="a policy with a latency_model section (slogate calibrate): play its default pool",
    )
    simulate.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="play only the workload's first this many seconds (a quick look)",
    )
    simulate.add_argument(
        "--waiting-room",
        action="store_true",
        help="dynamic control refusing a full pool at once (today), against retrying clients "
        "with and without the waiting room; seeds --seed and --seed + 4",
    )
    simulate.add_argument(
        "--sidecars",
        default=None,
        metavar="SPLIT",
        help="e.g. 0.4,0.3,0.2,0.1: one sidecar against that many sharing one KV ledger "
        "and against them with a ledger each; seeds --seed and --seed + 4",
    )
    simulate.add_argument(
        "--engines",
        action="store_true",
        help="engine picking: Envoy's round robin against slogate's, on chats, RAG and the "
        "field mix at 100/s on 4 engines and 1000/s on 40 (--duration-s, default 60 s), and "
        "an engine killed mid-run (bench/results/simulate-engines.*)",
    )


def add_calibrate_command(sub: argparse._SubParsersAction) -> None:
    calibrate = sub.add_parser(
        "calibrate", help="measure OpenAI-compatible endpoints; write their latency model"
    )
    calibrate.add_argument(
        "--url",
        action="append",
        required=True,
        help="[POOL=]URL of an endpoint (repeat for several pools; default pool name: default)",
    )
    policy_arg(calibrate)
    calibrate.add_argument("--model", default=None, help="model name (default: the policy's)")
    calibrate.add_argument("--api-key", default=None, help="Bearer key, e.g. through slogate")
    calibrate.add_argument("--requests", type=int, default=100, help="tiny requests per pool")
    calibrate.add_argument("--per-size", type=int, default=20, help="requests per probe size")
    calibrate.add_argument("--max-context", type=int, default=32_768)
    calibrate.add_argument("--out", type=Path, default=None, help="write the YAML here too")


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (results under bench/results/)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    overhead = bench_sub.add_parser("overhead", help="Envoy vs pass-through ext_proc vs slogate")
    overhead.add_argument("--duration-s", type=float, default=10.0)
    overhead.add_argument("--rounds", type=int, default=3)
    overhead.add_argument(
        "--profiles",
        default="small,field_mix,1k,8k,32k,128k,multi_turn,chinese,code,hostile",
        help="request bodies, comma-separated (small: the 4 KB body; others: bench/bodies.py)",
    )
    overhead.add_argument(
        "--levers",
        default="",
        help="slogate variants to run beside it, comma-separated (tooling/benchmarks/overhead.py"
        " LEVERS: no_split, count_on_loop, count_in_threads, no_count_cache, tiktoken)",
    )
    overhead.add_argument("--name", default="overhead", help="results file name")
    overhead.add_argument("--no-spy", action="store_true", help="skip the py-spy profile")
    overhead.add_argument(
        "--litellm",
        choices=("auto", "on", "off", "redis"),
        default="auto",
        help="LiteLLM's proxy beside slogate (tooling/benchmarks/litellm_arm.py, its own venv "
        ".venv-litellm): auto = when installed; redis = also both on a real Redis",
    )
    overhead.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    cost = bench_sub.add_parser("decision-cost", help="body decision p50/p99 per body profile")
    cost.add_argument("--seconds", type=float, default=4.0, help="per profile")
    cost.add_argument("--profiles", default="", help="comma-separated; default: all")
    cost.add_argument("--levers", default="", help="policy variants beside it (as bench overhead)")
    cost.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    tenants = bench_sub.add_parser("tenants", help="1,000 tenants / 10,000 keys vs the demo policy")
    tenants.add_argument("--seconds", type=float, default=20.0, help="per phase")
    tenants.add_argument("--tenants", type=int, default=1000)
    tenants.add_argument("--keys", type=int, default=10_000)
    tenants.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    estimator = bench_sub.add_parser("estimator", help="token estimate accuracy and speed")
    estimator.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    workers = bench_sub.add_parser("workers", help="serve --workers N throughput (1 vs 2)")
    workers.add_argument(
        "--workers", default="1,2", help="worker counts, comma-separated, from 1 (e.g. 1,2,4,8)"
    )
    workers.add_argument("--duration-s", type=float, default=10.0)
    workers.add_argument("--rounds", type=int, default=3)
    workers.add_argument("--profile", default="field_mix")
    workers.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    live = bench_sub.add_parser("engines-vllm", help="two real vLLMs: picking vs round robin")
    live.add_argument("--chats", type=int, default=24, help="per phase")
    live.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    packing = bench_sub.add_parser("packing-vllm", help="a packing window before one real vLLM")
    packing.add_argument("--window-ms", type=float, default=75.0)
    packing.add_argument("--rate", type=float, default=3.0, help="requests a second")
    packing.add_argument("--seconds", type=float, default=30.0, help="per run")
    packing.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    prefix = bench_sub.add_parser("prefix-index", help="the picker's prefix index under a flood")
    prefix.add_argument("--prompts", type=int, default=40_000)
    prefix.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    series = bench_sub.add_parser("tenant-series", help="tenant label cap: ns per request")
    series.add_argument("--calls", type=int, default=200_000, help="per round")
    series.add_argument("--rounds", type=int, default=5)
    series.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    tracing = bench_sub.add_parser("tracing", help="sidecar CPU per decision, tracing off vs on")
    tracing.add_argument("--requests", type=int, default=3000, help="per round")
    tracing.add_argument("--rounds", type=int, default=5)
    tracing.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    decisions = bench_sub.add_parser("decisions", help="budget decision cost per store")
    decisions.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    decisions.add_argument("--calls", type=int, default=5000)
