"""`slogate bench`: the benchmarks (tooling.benchmarks), results under bench/results/.
Each benchmark is imported inside the handler, only when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tooling.benchmarks.prefix_workload import Shape


def register(sub: argparse._SubParsersAction) -> None:
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
    listeners = bench_sub.add_parser(
        "listeners", help="Envoy to the sidecar: TCP loopback vs a Unix socket, per request"
    )
    listeners.add_argument("--duration-s", type=float, default=5.0, help="per measure")
    listeners.add_argument("--rounds", type=int, default=4, help="interleaved, order alternating")
    listeners.add_argument("--profile", default="small", help="request bodies (as bench overhead)")
    listeners.add_argument("--name", default="listeners", help="results file name")
    listeners.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    stages = bench_sub.add_parser(
        "stages", help="sidecar CPU per request by stage, beside the pass-through"
    )
    stages.add_argument("--seconds", type=float, default=6.0, help="per run")
    stages.add_argument("--rounds", type=int, default=3)
    stages.add_argument("--profiles", default="field_mix,small", help="comma-separated")
    stages.add_argument("--name", default="stages", help="results file name")
    stages.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout measured beside this one (a git worktree of the baseline)",
    )
    stages.add_argument("--requests", type=int, default=1500, help="in process, per run")
    stages.add_argument(
        "--in-process-only", action="store_true", help="no Envoy, no gRPC: the servicers alone"
    )
    stages.add_argument(
        "--one-message",
        action="store_true",
        help="in process, this checkout again with one ext_proc message per request "
        "(data_path.messages: one)",
    )
    stages.add_argument("--out-dir", type=Path, default=Path("bench/results"))
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
    reloads = bench_sub.add_parser(
        "reloads", help="resident memory and frozen objects over many reloads under traffic"
    )
    reloads.add_argument("--reloads", type=int, default=1000)
    reloads.add_argument("--tenants", type=int, default=1000)
    reloads.add_argument("--keys", type=int, default=10_000)
    reloads.add_argument("--out-dir", type=Path, default=Path("bench/results"))
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
    live.add_argument("--pairs", type=int, default=2, help="phases of each picker")
    live.add_argument(
        "--no-outage", action="store_true", help="leave out the engine stopped mid-run"
    )
    live.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    prefix_live = bench_sub.add_parser(
        "prefix-vllm", help="two real vLLMs: round robin vs approximate vs precise prefix"
    )
    prefix_live.add_argument("--customers", type=int, default=12, help="shared prompts")
    prefix_live.add_argument("--prefix-tokens", type=int, default=1024, help="each shared prompt")
    prefix_live.add_argument("--question-tokens", type=int, default=192, help="about, each")
    prefix_live.add_argument("--answer-tokens", type=int, default=16)
    prefix_live.add_argument("--rates", default="4,8,12", help="requests a second, a step each")
    prefix_live.add_argument("--step-s", type=float, default=15.0)
    prefix_live.add_argument("--kv-blocks", type=int, default=64, help="per engine, of 128 tokens")
    prefix_live.add_argument("--seed", type=int, default=38)
    prefix_live.add_argument(
        "--arms",
        type=prefix_arms,
        default="round-robin,approximate,precise",
        help="played in this order: round-robin, approximate, precise, precise-prefix-led",
    )
    prefix_live.add_argument("--out-dir", type=Path, default=Path("bench/results"))
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
    decisions = bench_sub.add_parser(
        "decisions", help="budget decision cost per store, and a request's Redis round trips"
    )
    decisions.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    decisions.add_argument("--calls", type=int, default=6000)
    decisions.add_argument("--rounds", type=int, default=3)
    decisions.add_argument(
        "--census-requests", type=int, default=100, help="requests whose round trips are counted"
    )
    regions = bench_sub.add_parser(
        "regions",
        help="2-3 regions in network namespaces, delayed WAN links: global budget, a move, "
        "a partition, crossing (needs root)",
    )
    regions.add_argument("--regions", type=int, default=3, choices=(2, 3))
    regions.add_argument(
        "--delays-ms",
        default="20,40,75",
        help="one-way delay of each region to the WAN hub, comma-separated (between two "
        "regions: the sum)",
    )
    regions.add_argument("--tokens-per-minute", type=int, default=120_000, help="global limit")
    regions.add_argument(
        "--request-tokens", type=int, default=2000, help="each request's output (ignore_eos)"
    )
    regions.add_argument("--spread-s", type=float, default=45.0, help="phase a")
    regions.add_argument("--move-s", type=float, default=25.0, help="phase b")
    regions.add_argument("--lease-s", type=float, default=4.0, help="phase c cuts 2x this")
    regions.add_argument("--report-interval-s", type=float, default=0.5)
    regions.add_argument("--saturate-s", type=float, default=25.0, help="phase d")
    regions.add_argument("--name", default="regions", help="results file name")
    regions.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    bench.set_defaults(handler=run_bench)


def prefix_arms(text: str) -> tuple[str, ...]:
    """`bench prefix-vllm --arms`: names of its arms, each known."""
    from tooling.benchmarks.prefix_live import ARMS

    arms = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in arms if name not in ARMS]
    if unknown or not arms:
        raise argparse.ArgumentTypeError(
            f"unknown arm {', '.join(unknown) or '(none given)'}; known: {', '.join(ARMS)}"
        )
    return arms


def prefix_shape(args: argparse.Namespace) -> Shape:
    """`bench prefix-vllm`'s case from its flags."""
    from tooling.benchmarks.prefix_workload import Shape

    return Shape(
        customers=args.customers,
        prefix_tokens=args.prefix_tokens,
        question_tokens=args.question_tokens,
        answer_tokens=args.answer_tokens,
        rates=tuple(float(rate) for rate in args.rates.split(",")),
        step_s=args.step_s,
        kv_blocks=args.kv_blocks,
        seed=args.seed,
    )


def run_bench(args: argparse.Namespace) -> int:
    if args.bench == "overhead":
        from tooling.benchmarks.overhead import run as run_overhead

        run_overhead(
            args.out_dir,
            args.duration_s,
            args.rounds,
            args.profiles.split(","),
            spy=not args.no_spy,
            levers=[lever for lever in args.levers.split(",") if lever],
            name=args.name,
            litellm=args.litellm,
        )
    elif args.bench == "listeners":
        from tooling.benchmarks.listeners import run as run_listeners

        run_listeners(args.out_dir, args.duration_s, args.rounds, args.profile, args.name)
    elif args.bench == "stages":
        from tooling.benchmarks.stages import run as run_stages

        run_stages(
            args.out_dir,
            args.seconds,
            args.rounds,
            args.profiles.split(","),
            args.name,
            args.baseline,
            args.requests,
            live=not args.in_process_only,
            one_message=args.one_message,
        )
    elif args.bench == "tenants":
        from tooling.benchmarks.tenants import run as run_tenants

        run_tenants(args.out_dir, args.seconds, args.tenants, args.keys)
    elif args.bench == "reloads":
        from tooling.benchmarks.reloads import run as run_reloads

        run_reloads(args.out_dir, args.reloads, args.tenants, args.keys)
    elif args.bench == "decision-cost":
        from tooling.benchmarks.decision_cost import run as run_decision_cost

        run_decision_cost(
            args.out_dir,
            args.seconds,
            args.profiles.split(",") if args.profiles else None,
            [lever for lever in args.levers.split(",") if lever],
        )
    elif args.bench == "workers":
        from tooling.benchmarks.workers import run as run_workers

        counts = [int(n) for n in args.workers.split(",")]
        run_workers(args.out_dir, args.duration_s, args.rounds, args.profile, counts)
    elif args.bench == "engines-vllm":
        from tooling.benchmarks.engines_live import run as run_engines_live

        run_engines_live(args.out_dir, args.chats, args.pairs, not args.no_outage)
    elif args.bench == "prefix-vllm":
        from tooling.benchmarks.prefix_live import run as run_prefix_live

        run_prefix_live(args.out_dir, prefix_shape(args), args.arms)
    elif args.bench == "packing-vllm":
        from tooling.benchmarks.packing import run as run_packing

        run_packing(args.out_dir, args.seconds, args.rate, args.window_ms)
    elif args.bench == "prefix-index":
        from tooling.benchmarks.prefix_index import run as run_prefix_index

        run_prefix_index(args.out_dir, args.prompts)
    elif args.bench == "tenant-series":
        from tooling.benchmarks.tenant_series import run as run_tenant_series

        run_tenant_series(args.out_dir, args.calls, args.rounds)
    elif args.bench == "tracing":
        from tooling.benchmarks.tracing_cost import run as run_tracing

        run_tracing(args.out_dir, args.requests, args.rounds)
    elif args.bench == "decisions":
        from tooling.benchmarks.decisions import run as run_decisions

        run_decisions(args.out_dir, args.calls, args.rounds, args.census_requests)
    elif args.bench == "regions":
        from tooling.benchmarks.regions import LabShape
        from tooling.benchmarks.regions import run as run_regions

        shape = LabShape(
            regions=args.regions,
            delays_ms=tuple(float(d) for d in args.delays_ms.split(",")),
            tokens_per_minute=args.tokens_per_minute,
            request_tokens=args.request_tokens,
            spread_s=args.spread_s,
            move_s=args.move_s,
            report_interval_s=args.report_interval_s,
            lease_s=args.lease_s,
            saturate_s=args.saturate_s,
        )
        return run_regions(args.out_dir, shape, args.name)
    else:
        from tooling.benchmarks.estimator import run as run_estimator

        run_estimator(args.out_dir)
    return 0
